"""A compile fuzzer of model-like programs: a tap never breaks a program.

Each seed makes one program of the kind users tap: dense layers (widths 32
to 512), convolutions, attention, layer norms, activations and reductions,
used as a forward pass, `grad`, `value_and_grad`, a `scan` of training
steps, `vmap` over examples or `pmap` over 4 CPU devices. Taps and calls go
at random places on random values: activations, reductions of them,
gradients, the returned values themselves. Each program is compiled and run
without the taps, then with them on each transport and in each mode; it
must compile whenever the untapped one does, and return the same values:
bitwise, or, where observing an intermediate makes XLA fuse a reduction
differently, within float32 reassociation (each output within 1e-5 of its
largest magnitude). Products and convolutions run at the "highest"
precision, full float32 on a GPU too.

    python -m tools.compile_fuzz [--seeds 200] [--start 0] [--verbose]

exits 1 when a program breaks. `tests/test_compile_fuzz.py` runs a fixed
set of seeds in CI.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import argparse  # noqa: E402  (after XLA_FLAGS)
import dataclasses  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import host_callback as hcb  # noqa: E402
from host_callback.host import transport_policy  # noqa: E402

RELATIVE_TOLERANCE = 1e-5  # float32 reassociation (_relative_difference)
PMAP_DEVICES = 4

ACTIVATIONS: Dict[str, Callable[[Any], Any]] = {
    "tanh": jnp.tanh, "relu": jax.nn.relu, "gelu": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid, "exp": lambda v: jnp.exp(-jnp.abs(v)),
    "softplus": jax.nn.softplus,
}
REDUCTIONS: Dict[str, Callable[[Any], Any]] = {
    "sum": jnp.sum, "mean": jnp.mean, "max": jnp.max,
    "norm": jnp.linalg.norm,
}
# What a site does with its value, when tapped (see Observer), with its
# weight: logging a reduction of an activation is the most common.
ACTIONS = {"none": 2, "tap": 2, "tap_reduction": 3, "tap_first": 1,
           "call": 1, "call_reduction": 1}
USES = ("forward", "grad", "value_and_grad", "scan", "vmap", "pmap")


# --- the host functions: one of each, so programs share them -------------

_deliveries: List[int] = []


def _record(arg: Any, transforms: Any) -> None:
  del arg, transforms
  _deliveries.append(1)


def _identity(arg: Any) -> Any:
  _deliveries.append(1)
  return arg


# --- where taps go --------------------------------------------------------

class Observer:
  """Called at every site of a program with its value; without taps it
  returns the value, with taps it does what the seed chose for the site:
  taps the value (and goes on with what the tap returns), taps a reduction
  of it or its first element, or passes it through an identity `call`
  (where nothing differentiates it)."""

  def __init__(self, seed: int, tapped: bool) -> None:
    self.seed = seed
    self.tapped = tapped
    self.used: List[str] = []

  def action(self, site: str) -> Tuple[str, str]:
    rng = random.Random(zlib.crc32(f"{self.seed}/{site}".encode()))
    action, = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))
    return action, rng.choice(sorted(REDUCTIONS))

  def __call__(self, site: str, value: Any, differentiated: bool) -> Any:
    if not self.tapped:
      return value
    action, reduction = self.action(site)
    if differentiated and action.startswith("call"):
      action = "tap" + action[len("call"):]  # a call has no derivative
    if action != "none":
      self.used.append(f"{site}:{action}")
    reduced = lambda: REDUCTIONS[reduction](value)  # noqa: E731
    if action == "tap":
      return hcb.id_tap(_record, value)
    if action == "tap_reduction":
      hcb.id_tap(_record, reduced())
    elif action == "tap_first":
      hcb.id_tap(_record, value.reshape(-1)[0])
    elif action == "call":
      return hcb.call(_identity, value, result_shape=jax.ShapeDtypeStruct(
          value.shape, value.dtype))
    elif action == "call_reduction":
      r = reduced()
      hcb.call(_identity, r, result_shape=jax.ShapeDtypeStruct(r.shape,
                                                               r.dtype))
    return value


Observe = Callable[[str, Any, bool], Any]


# --- models: params, an input, and a forward pass with sites ------------------

def _layer_norm(h: Any) -> Any:
  mean = jnp.mean(h, axis=-1, keepdims=True)
  var = jnp.var(h, axis=-1, keepdims=True)
  return (h - mean) * jax.lax.rsqrt(var + 1e-5)


def _normal(key: Any, shape: Tuple[int, ...], scale: float = 1.0) -> Any:
  return scale * jax.random.normal(key, shape, jnp.float32)


@dataclasses.dataclass
class Model:
  """A model: its params, an input and a target, and a forward pass
  `forward(params, x, observe, differentiated)`."""
  name: str
  params: Any
  x: Any
  y: Any
  forward: Callable[..., Any]


def _mlp(rng: random.Random, key: Any) -> Model:
  batch = rng.choice([16, 64, 128, 256])
  depth = rng.randint(1, 3)
  widths = [rng.choice([32, 64, 128, 256, 512]) for _ in range(depth + 1)]
  act = rng.choice(sorted(ACTIVATIONS))
  norm = rng.random() < 0.5
  keys = jax.random.split(key, depth + 2)
  params = [(_normal(keys[i], (widths[i], widths[i + 1]),
                     widths[i] ** -0.5), jnp.zeros(widths[i + 1]))
            for i in range(depth)]

  def forward(params, x, observe, differentiated):
    h = x
    for i, (w, b) in enumerate(params):
      h = observe(f"dense{i}", h @ w + b, differentiated)
      h = observe(f"{act}{i}", ACTIVATIONS[act](h), differentiated)
      if norm:
        h = observe(f"norm{i}", _layer_norm(h), differentiated)
    return h

  return Model(f"mlp{widths} batch {batch} {act}{' norm' if norm else ''}",
               params, _normal(keys[-2], (batch, widths[0])),
               _normal(keys[-1], (batch, widths[-1])), forward)


def _conv(rng: random.Random, key: Any) -> Model:
  batch = rng.choice([1, 4, 16])
  size = rng.choice([8, 16])
  channels = [rng.choice([1, 3]), rng.choice([8, 16, 32]),
              rng.choice([16, 32])]
  act = rng.choice(sorted(ACTIVATIONS))
  outputs = rng.choice([10, 32])
  keys = jax.random.split(key, 5)
  params = {
      "conv": [_normal(keys[i], (3, 3, channels[i], channels[i + 1]),
                       (9 * channels[i]) ** -0.5) for i in range(2)],
      "head": _normal(keys[2], (channels[-1], outputs),
                      channels[-1] ** -0.5),
  }

  def forward(params, x, observe, differentiated):
    h = x
    for i, kernel in enumerate(params["conv"]):
      h = jax.lax.conv_general_dilated(
          h, kernel, (1, 1), "SAME",
          dimension_numbers=("NHWC", "HWIO", "NHWC"))
      h = observe(f"conv{i}", ACTIVATIONS[act](h), differentiated)
    pooled = observe("pool", jnp.mean(h, axis=(1, 2)), differentiated)
    return observe("head", pooled @ params["head"], differentiated)

  return Model(f"conv{channels} batch {batch} {size}x{size} {act}", params,
               _normal(keys[3], (batch, size, size, channels[0])),
               _normal(keys[4], (batch, outputs)), forward)


def _attention(rng: random.Random, key: Any) -> Model:
  seq = rng.choice([16, 64, 128])
  width = rng.choice([32, 64, 128])
  keys = jax.random.split(key, 6)
  params = {name: _normal(k, (width, width), width ** -0.5)
            for name, k in zip(("q", "k", "v", "out"), keys)}

  def forward(params, x, observe, differentiated):
    q, k, v = (x @ params[name] for name in ("q", "k", "v"))
    scores = observe("scores", q @ k.T / np.sqrt(width), differentiated)
    weights = observe("softmax", jax.nn.softmax(scores, axis=-1),
                      differentiated)
    h = observe("attended", weights @ v, differentiated)
    h = observe("norm", _layer_norm(h + x), differentiated)
    return h @ params["out"]

  return Model(f"attention seq {seq} width {width}", params,
               _normal(keys[4], (seq, width)), _normal(keys[5], (seq, width)),
               forward)


MODELS = (_mlp, _conv, _attention)


# --- uses of a model ------------------------------------------------------

@dataclasses.dataclass
class Program:
  """What one seed makes: `build(observe)` gives the function to compile
  (with `jax.jit`, or already a `pmap`), `args` its inputs."""
  seed: int
  description: str
  build: Callable[[Observe], Callable[..., Any]]
  args: Tuple[Any, ...]
  pmapped: bool = False


def _loss(model: Model, observe: Observe, reduction_site: bool = True
          ) -> Callable[..., Any]:
  def loss(params, x, y):
    out = model.forward(params, x, observe, True)
    value = jnp.mean((out - y) ** 2)
    return observe("loss", value, True) if reduction_site else value
  return loss


def _grads_observed(grads: Any, observe: Observe) -> Any:
  leaves, tree = jax.tree_util.tree_flatten(grads)
  return tree.unflatten([observe(f"grad{i}", g, False)
                         for i, g in enumerate(leaves)])


def make_program(seed: int) -> Program:
  """The program of `seed`."""
  rng = random.Random(seed)
  model = rng.choice(MODELS)(rng, jax.random.key(seed))
  use = rng.choice(USES)
  returns_loss = rng.random() < 0.5
  # What a forward pass logs of what it returns: a reduction of it (of the
  # ROOT, "log the mean of the logits"), the loss, or the value itself.
  summary = REDUCTIONS[rng.choice(["sum", "mean", "max"])]
  logged = rng.choice(["summary", "summary", "loss", "out"])
  name = f"seed {seed}: {use} of {model.name}, logging {logged}"

  if use == "forward":
    def build(observe):
      def forward(params, x, y):  # "log the loss, return the logits"
        out = model.forward(params, x, observe, False)
        loss = jnp.mean((out - y) ** 2)
        if logged == "out":
          out = observe("out", out, False)
        elif logged == "loss":
          loss = observe("loss", loss, False)
        else:
          observe("summary", summary(out), False)
        return (out, loss) if returns_loss else out
      return forward
    return Program(seed, name, build, (model.params, model.x, model.y))

  if use in ("grad", "value_and_grad"):
    def build(observe):
      loss = _loss(model, observe)
      def step(params, x, y):
        if use == "grad":
          return _grads_observed(jax.grad(loss)(params, x, y), observe)
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return observe("value", value, False), _grads_observed(grads,
                                                               observe)
      return step
    return Program(seed, name, build, (model.params, model.x, model.y))

  if use == "scan":
    steps = rng.choice([3, 8])

    def build(observe):
      loss = _loss(model, observe)
      def train(params, x, y):
        def body(params, _):
          value, grads = jax.value_and_grad(loss)(params, x, y)
          grads = _grads_observed(grads, observe)
          params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params,
                                          grads)
          return params, observe("step_loss", value, False)
        params, losses = jax.lax.scan(body, params, None, length=steps)
        return (params, losses) if returns_loss else losses
      return train
    return Program(seed, f"{name}, {steps} steps", build,
                   (model.params, model.x, model.y))

  batch = rng.choice([2, 4])  # of inputs, each a batch itself
  xs = jnp.stack([model.x * (1 + i / 10) for i in range(batch)])
  ys = jnp.stack([model.y] * batch)

  if use == "vmap":
    def build(observe):
      def forward(params, x, y):
        out = model.forward(params, x, observe, False)
        if logged != "out":
          observe("summary", summary(out), False)
        return out if not returns_loss else (out, jnp.mean((out - y) ** 2))
      return jax.vmap(forward, in_axes=(None, 0, 0))
    return Program(seed, f"{name}, batch {batch}", build,
                   (model.params, xs, ys))

  # pmap over 4 devices: a data-parallel step.
  xs = jnp.stack([model.x * (1 + i / 10) for i in range(PMAP_DEVICES)])
  ys = jnp.stack([model.y] * PMAP_DEVICES)
  params = jax.tree_util.tree_map(
      lambda p: jnp.stack([p] * PMAP_DEVICES), model.params)

  def build(observe):
    loss = _loss(model, observe)
    def step(params, x, y):
      value, grads = jax.value_and_grad(loss)(params, x, y)
      grads = jax.lax.pmean(grads, "devices")
      grads = _grads_observed(grads, observe)
      return (value, grads) if returns_loss else grads
    return jax.pmap(step, axis_name="devices",
                    devices=jax.devices("cpu")[:PMAP_DEVICES])
  return Program(seed, name, build, (params, xs, ys), pmapped=True)


# --- running and comparing -----------------------------------------------

@dataclasses.dataclass
class Outcome:
  """How a program fared in one configuration."""
  seed: int
  config: str
  status: str  # "bitwise", "reassociated", "broken", "untapped-fails"
  detail: str = ""
  sites: Tuple[str, ...] = ()


def _compile_and_run(program: Program, observe: Observe) -> Any:
  """`program`'s values, its products and convolutions in full float32: a
  GPU's default precision (TF32 on NVIDIA's) would set the tapped and
  untapped programs apart by more than reassociation where XLA fuses them
  differently. On CPU, where they are float32 anyway, the compiled
  programs are the same."""
  with jax.default_matmul_precision("highest"):
    fun = program.build(observe)
    if not program.pmapped:
      fun = jax.jit(fun)
    out = fun(*program.args)
  hcb.barrier_wait()
  return jax.tree_util.tree_map(np.asarray, out)


def _relative_difference(a: np.ndarray, b: np.ndarray) -> float:
  """The largest difference between `a` and `b` relative to the largest
  magnitude in `b`: reassociating a float32 sum moves each element by a few
  units in the last place of the sum's scale, not of the element's (a layer
  norm's output near zero)."""
  scale = float(np.max(np.abs(b))) if b.size else 0.0
  worst = float(np.max(np.abs(a.astype(np.float64) - b))) if b.size else 0.0
  return worst / scale if scale else (0.0 if worst == 0 else float("inf"))


def _compare(tapped: Any, untapped: Any) -> Tuple[str, str]:
  a_leaves, a_tree = jax.tree_util.tree_flatten(tapped)
  b_leaves, b_tree = jax.tree_util.tree_flatten(untapped)
  if a_tree != b_tree:
    return "broken", f"trees differ: {a_tree} and {b_tree}"
  status = "bitwise"
  for i, (a, b) in enumerate(zip(a_leaves, b_leaves)):
    if a.shape != b.shape or a.dtype != b.dtype:
      return "broken", f"leaf {i}: {a.shape} {a.dtype} and {b.shape} {b.dtype}"
    if np.array_equal(a, b):
      continue
    difference = _relative_difference(a, b)
    if not difference <= RELATIVE_TOLERANCE:
      return "broken", f"leaf {i} differs by {difference:.2g} relative"
    status = "reassociated"
  return status, ""


def configurations() -> List[Tuple[str, bool]]:
  """The (transport, outfeed mode) pairs this installation has on CPU."""
  return [(t, outfeed) for t in transport_policy.available_on_cpu()
          for outfeed in (False, True)]


def run_seed(seed: int, configs: Optional[List[Tuple[str, bool]]] = None
             ) -> List[Outcome]:
  """The outcomes of `seed`'s program in each configuration."""
  program = make_program(seed)
  try:
    untapped = _compile_and_run(program, Observer(seed, tapped=False))
  except Exception as error:  # pylint: disable=broad-except
    return [Outcome(seed, "untapped", "untapped-fails",
                    str(error).splitlines()[0])]
  outcomes = []
  for transport, outfeed in configs or configurations():
    config = f"{transport}, {'outfeed' if outfeed else 'synchronous'}"
    jax.config.update("jax_host_callback_transport", transport)
    jax.config.update("jax_host_callback_outfeed", outfeed)
    observer = Observer(seed, tapped=True)
    try:
      del _deliveries[:]
      tapped = _compile_and_run(program, observer)
      status, detail = _compare(tapped, untapped)
      if observer.used and not _deliveries:
        status, detail = "broken", "no tap or call reached the host"
    except Exception as error:  # pylint: disable=broad-except
      status, detail = "broken", (
          f"{type(error).__name__}: {str(error).splitlines()[0]}")
    finally:
      jax.config.update("jax_host_callback_transport", "auto")
      jax.config.update("jax_host_callback_outfeed", False)
    outcomes.append(Outcome(seed, config, status, detail,
                            tuple(observer.used)))
  return outcomes


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=200)
  parser.add_argument("--start", type=int, default=0)
  parser.add_argument("--verbose", action="store_true")
  args = parser.parse_args(argv)
  counts: Dict[str, int] = {}
  broken = 0
  for seed in range(args.start, args.start + args.seeds):
    program = make_program(seed)
    for outcome in run_seed(seed):
      counts[outcome.status] = counts.get(outcome.status, 0) + 1
      if outcome.status == "broken" or args.verbose:
        print(f"{outcome.status}: {program.description} [{outcome.config}] "
              f"{outcome.detail} sites {list(outcome.sites)}", flush=True)
      broken += outcome.status == "broken"
  print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
  return 1 if broken else 0


if __name__ == "__main__":
  sys.exit(main())
