"""XLA's CPU library fusion bug, reproduced without host_callback.

The report for upstream (docs/xla_root_fusion.md): minimal StableHLO modules
compiled with JAX's CPU client alone. An entry computation whose ROOT (a
product, or an elementwise op) has exactly one other user, a reduction whose
result only a side-effecting custom call reads, is refused by the CPU
library fusion of reductions (YNNPACK's, on by default):

    INTERNAL: RET_CHECK failure (.../hlo_computation.cc:...)
    instruction->IsDead() instruction dot.1 is live and cannot be removed

    python -m tools.xla_root_fusion [--print-module]

prints each case and what XLA did with it. The side effect is JAX's own CPU
callback target, which compiles without a callback registered (nothing
runs).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Tuple

import jax
from jax.extend.backend import get_backend
from jax._src.lib import xla_client

_OBSERVE = ("stablehlo.custom_call @xla_ffi_python_cpu_callback({value}) "
            "{{has_side_effect = true, api_version = 4 : i32, "
            "backend_config = {{index = 0 : ui64}}}} : ({type}) -> ()")


def module(size: int, root: str = "dot", root_observed: bool = False) -> str:
  """The module: `root` ('dot' for x @ w, 'tanh' for tanh(x + w)) is
  returned, and its sum is observed; with `root_observed`, the ROOT itself
  is observed too (a second user, as host_callback's end mark is)."""
  t = f"tensor<{size}x{size}xf32>"
  if root == "dot":
    body = (f"%y = stablehlo.dot_general %x, %w, contracting_dims = [1] x "
            f"[0] : ({t}, {t}) -> {t}")
  else:
    body = f"%xw = stablehlo.add %x, %w : {t}\n    %y = stablehlo.tanh %xw : {t}"
  observe_root = _OBSERVE.format(value="%y", type=t) if root_observed else ""
  return f"""module @root_fusion {{
  func.func public @main(%x: {t}, %w: {t}) -> {t} {{
    {body}
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%y init: %zero) applies stablehlo.add across dimensions = [0, 1] : ({t}, tensor<f32>) -> tensor<f32>
    {_OBSERVE.format(value="%sum", type="tensor<f32>")}
    {observe_root}
    return %y : {t}
  }}
}}
"""


# (what, module, XLA debug options)
CASES: List[Tuple[str, str, Tuple[Tuple[str, str], ...]]] = [
    ("ROOT x @ w (64x64), its sum observed", module(64), ()),
    ("ROOT tanh(x + w) (64x64), its sum observed", module(64, "tanh"), ()),
    ("the same at 48x48 (below the library's size)", module(48), ()),
    ("ROOT x @ w (64x64), its sum and itself observed",
     module(64, root_observed=True), ()),
    ("ROOT x @ w (64x64), its sum observed, no YNN reduction fusion",
     module(64), (("xla_cpu_experimental_ynn_fusion_type",
                   "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)),
    ("ROOT tanh(x + w) (64x64), its sum observed, no YNN reduction fusion",
     module(64, "tanh"), (("xla_cpu_experimental_ynn_fusion_type",
                           "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)),
]


def compile_case(text: str, options: Tuple[Tuple[str, str], ...]) -> str:
  """'compiled', or XLA's error's first line."""
  backend = get_backend("cpu")
  compile_options = xla_client.CompileOptions()
  compile_options.env_option_overrides = list(options)
  devices = xla_client.DeviceList(tuple(backend.local_devices()[:1]))
  try:
    backend.compile_and_load(text, devices, compile_options)
  except Exception as error:  # pylint: disable=broad-except
    return "refused: " + str(error).splitlines()[0]
  return "compiled"


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--print-module", action="store_true",
                      help="print the first case's module")
  args = parser.parse_args(argv)
  print(f"jax {jax.__version__}")
  if args.print_module:
    print(CASES[0][1])
  for what, text, options in CASES:
    print(f"{what}: {compile_case(text, options)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
