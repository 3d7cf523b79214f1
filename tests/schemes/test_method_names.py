"""The light name list the config schema reads equals the stepper registries (one list, two views)."""

from attnflow.schemes import integrators, names


def test_names_match_the_registries():
    assert names.FIXED_STEP == tuple(integrators.INTEGRATORS)
    assert names.MOVEMENT == tuple(integrators.MOVEMENTS)
    assert names.ADAPTIVE_NAMES == tuple(integrators.ADAPTIVE)
    assert names.METHOD_NAMES == integrators.METHODS


def test_a_registry_change_would_be_seen(monkeypatch):
    """Negative control: a stepper added to the registry alone makes the lists differ."""
    monkeypatch.setitem(integrators.INTEGRATORS, "rk5", integrators.INTEGRATORS["rk4"])
    assert names.FIXED_STEP != tuple(integrators.INTEGRATORS)


def test_orders_match_the_steppers(monkeypatch):
    """The light order table (read by the saved-run budget without torch) is the steppers' own ``order``."""
    assert names.METHOD_ORDER == {m: integrators.get_integrator(m).order for m in integrators.METHODS}
    # negative control: a stepper whose order changed would make them differ
    monkeypatch.setitem(integrators.INTEGRATORS, "rk4", integrators.INTEGRATORS["heun"])
    assert names.METHOD_ORDER != {m: integrators.get_integrator(m).order for m in integrators.METHODS}
