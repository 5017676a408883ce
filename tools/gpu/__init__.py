"""The GPU kit: validates the native CUDA transport on a GPU machine.

`python -m tools.gpu.check` is the one command (its plan: `plan`, the
suite as it runs it: `suite`, the speed targets: `targets`); the others
run alone too: `timings`, `compile_during_call` (with `hung_cases` and
`native_stacks`) and `hardware` (CUDA programs built with nvcc).
"""
