"""The method names, without the steppers: what the config schema validates against.

Plain tuples, so that checking a config (``method: rk5``) needs no torch. They list the keys of the
registries in :mod:`attnflow.schemes.integrators` (``INTEGRATORS``, ``MOVEMENTS``, ``ADAPTIVE``), in
the same order; ``tests/schemes/test_method_names.py`` holds the two equal.
"""

from __future__ import annotations

#: Explicit fixed-step steppers (``INTEGRATORS``).
FIXED_STEP: tuple[str, ...] = ("euler", "heun", "rk4")
#: Implicit minimising movements, model ``gf`` only (``MOVEMENTS``).
MOVEMENT: tuple[str, ...] = ("jko",)
#: Embedded pairs with error control (``ADAPTIVE``).
ADAPTIVE_NAMES: tuple[str, ...] = ("bosh3", "dopri5", "dop853")
#: Every method name, in the order of ``attnflow.schemes.integrators.METHODS``.
METHOD_NAMES: tuple[str, ...] = (*FIXED_STEP, *MOVEMENT, *ADAPTIVE_NAMES)
#: Classical order of each method (an adaptive pair: that of the solution it keeps), the ``order`` of
#: the steppers in :mod:`attnflow.schemes.integrators`; read by the budget of a saved run without torch.
METHOD_ORDER: dict[str, int] = {"euler": 1, "heun": 2, "rk4": 4, "jko": 1, "bosh3": 3, "dopri5": 5, "dop853": 8}
