"""Progress bars for jitted loops, with jax-tqdm's interface: `scan_tqdm`,
`loop_tqdm`, `while_tqdm` and `PBar`. The public path of
`host_callback.bars.decorators`."""

from .bars.decorators import PBar, loop_tqdm, scan_tqdm, while_tqdm

__all__ = ["PBar", "loop_tqdm", "scan_tqdm", "while_tqdm"]
