"""Loop telemetry for unmodified JAX code, on host_callback's taps: a
drop-in for jax-tap (`import host_callback.loops as tap` where code had
`import jaxtap as tap`).

    import host_callback.loops as tap

    with tap.record(select=lambda leaves: leaves[0]) as rec:
      result = run(x)           # unmodified; returns the same values
    rec.events                  # TapEvent(path="scan[0]", step=0, ...)

Every step of each `lax.scan` and `lax.while_loop` (at any depth, with a
stable address such as `scan[0]/while[1]`) sends what `select` keeps of its
carry with `id_tap`'s primitive (through `api.consumer_tap`, its one door
into the core), so taps are ordered with the program's other taps and
calls. The parts, by job: `options` (`LensOptions`, the options `verbose`
and `record` share), `events` (`TapEvent`), `primitive_taps` (`on`,
`watch_nan`, `print`), `walker` and `loop_rewrites` (the instrumented
evaluation of a traced function), `emission` (the taps and their host
functions), `delivery` (observers, alerts, warn-once), `verbose`,
`recording` and `patching` (`record`), `lens_keys`, `collectors`,
`discovery` (`primitives`).
"""

from .collectors import FlightRecorder, JSONLWriter, read_jsonl
from .delivery import _alert_warned, _warned  # noqa: F401 (jax-tap's names)
from .discovery import primitives
from .events import TapEvent
from .patching import original_scan
from .primitive_taps import PrimitiveTap, on, print, watch_nan  # noqa: A004
from .recording import emergency_restore, record
from .verbose import verbose

__all__ = [
    "FlightRecorder", "JSONLWriter", "PrimitiveTap", "TapEvent",
    "emergency_restore", "on", "original_scan", "primitives", "print",
    "read_jsonl", "record", "verbose", "watch_nan",
]
