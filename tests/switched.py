"""The suite with the lifecycle switch on
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders).

``DSH_SCHEDULE_LIFECYCLE=on python3 dev.py test PATHS`` runs the same tests with the
lifecycle on wherever a test does not name the switch itself: every ``Settings`` built in
the test process defaults to ``lifecycle=True`` (``Settings(...)``, ``Settings.from_env({})``
and ``msgspec.structs.replace`` alike; a test that passes ``lifecycle=False`` keeps it
off), ``process_env`` hands the switch to the processes a test starts, and the CLI and
the catalog read it from the environment as they do in a deployment. ``conftest.py``
installs it before anything imports ``Settings``.
"""

from __future__ import annotations

import os
import sys

SWITCH = "DSH_SCHEDULE_LIFECYCLE"


def lifecycle_suite() -> bool:
    """Whether this run has the lifecycle switch on in its environment."""
    from dsh_schedule.shared.settings import lifecycle_from_env

    return lifecycle_from_env(os.environ)


def install() -> None:
    """With the switch on in the environment, make ``lifecycle=True`` the default of
    every ``Settings`` this process builds from now on."""
    if not lifecycle_suite():
        return
    from dsh_schedule.shared import settings as module

    base = module.Settings
    if msgspec_default(base) is True:
        return  # installed already

    class Settings(base, frozen=True, kw_only=True):  # type: ignore[misc,valid-type]
        lifecycle: bool = True

    Settings.__module__ = base.__module__
    Settings.__qualname__ = base.__qualname__
    # Every module that imported the class already names the new one too.
    for name, loaded in list(sys.modules.items()):
        if (name.startswith(("dsh_schedule", "tests"))
                and getattr(loaded, "Settings", None) is base):
            loaded.Settings = Settings  # type: ignore[attr-defined]


def msgspec_default(cls: type) -> object:
    """The default of ``cls``'s ``lifecycle`` field."""
    import msgspec

    (field,) = [f for f in msgspec.structs.fields(cls) if f.name == "lifecycle"]
    return field.default
