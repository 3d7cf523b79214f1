from attnflow.cli import entrypoint

entrypoint()
