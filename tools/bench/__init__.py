"""Benchmarks of host_callback against JAX's own callbacks, in the same run.

    python -m tools.bench                 # print the tables
    python -m tools.bench --write docs    # also write docs/benchmarks.md
    python -m tools.bench --quick         # smaller sizes, for a smoke test
    python -m tools.bench --only "MiB"    # the scenarios whose id or title
                                          # matches (a regular expression)
    python -m tools.bench --list          # each scenario's id and title

Each scenario (`scenarios.py`, `barrier_scenarios.py`, `tap_then_call.py`)
has a stable id, which `--only`, the page's summary and its topics
(`page.py`) name. A run without `--only` fails, after printing its tables, if a
scenario that the summary names has no row (the page is then not
written); `--write` is refused with `--only`, and an id that the summary
or a topic names but no scenario has fails any run at its start.

Rows run in the outfeed mode (asynchronous taps) unless they say
"synchronous" (the CPU default). Each row times one scenario for
host_callback on every available transport and for `jax.debug.callback`,
`jax.experimental.io_callback(ordered=True)` and, for calls,
`jax.pure_callback`; ratios are `baseline time / host_callback time`
(above 1: host_callback is faster). Times are the median of `--repeat`
runs after a warm-up run that compiles.

The progress-bar rows time `host_callback.tqdm.scan_tqdm` and jax-tqdm 0.4's
(its column is empty, with a note, where jax-tqdm is not installed) on a
20k-step scan of a 16x16 matmul: the cost of each bar update with
`print_rate=1`, and the whole scan with the default rate (every n/20 steps)
beside the same scan without a bar.

The loop rows time `host_callback.loops.verbose` and jax-tap's (its column
is empty, with a note, where jax-tap is not installed): what an event with a
scalar `select` (the carry's mean) adds to each step of a 20k-step trivial
scan, and a 2k-step scan of a 64x64 matmul with `sample_every=100` beside
the same scan without a lens and with jax-tap's, run in turns (100 x
`--repeat` of each; the medians), since the VM's drift between long runs
is larger than the difference; that row twice, as the process runs and
with all its threads on one core (`machine.on_one_core`, on Linux).

The floor rows time what a tap in a scan step cannot go below
(`floors.py`): a custom call that does nothing (XLA's dispatch) and one
that takes the GIL and calls a Python function that does nothing (the
Python floor), each over the bare scan, in turns with it. The summary's
last column is each hot row's time / its floor's (`page.FLOORS`): the
synchronous and outfeed taps in a scan and the loop event, each beside the
Python floor, since each runs a Python host function once a step.

The large-array rows also time `jit(lambda x: x + 1)` on the same array, one
pass over the data: the yardstick for a tap (one copy) and a call. The
`buffers=True` row (an identity that fills `out=`) is beside `call` without
`buffers` and `jax.experimental.buffer_callback` (no column where the
installed JAX lacks it). Their taps return one element of the array, not
the array: a jitted function that returns its argument makes XLA copy it
into a new output buffer, which would time XLA rather than the callback.
The "size sweep" rows time an outfeed tap of 4 bytes to 1 GiB on each
transport.
"""
