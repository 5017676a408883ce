"""The compile fuzzer's fixed seeds (tools/compile_fuzz.py): each program
compiles with its taps and calls on this test's transport, in both modes,
and returns the untapped program's values (bitwise, or within float32
reassociation where a reduction is fused differently).

Seeds 29, 30, 37, 48 and 54 make programs that XLA refuses without the
package's lowering (docs/xla_root_fusion.md): a `vmap` or forward pass that
logs a reduction of what it returns, or its loss.
"""

import pytest

from tools import compile_fuzz

CI_SEEDS = [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 29, 30, 37, 48, 54]


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_seed(seed, transport):
  outcomes = compile_fuzz.run_seed(seed, [(transport, False),
                                          (transport, True)])
  program = compile_fuzz.make_program(seed).description
  assert [o.status for o in outcomes] != ["untapped-fails"], (
      program, outcomes[0].detail)
  broken = [f"[{o.config}] {o.detail} sites {list(o.sites)}"
            for o in outcomes if o.status == "broken"]
  assert broken == [], program
  assert len(outcomes) == 2
