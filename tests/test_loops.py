"""host_callback.loops, jax-tap's loop telemetry on id_tap: the exact events
of nested loops, sampling, selection, the program's values unchanged under
jit, vmap and grad, order with the program's own taps, callbacks that
raise, primitive taps, scan outputs and the collectors."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import host_callback as hcb
import host_callback.loops as tap
from host_callback.loops import collectors
from helpers import cpu_devices


def nested(x0, xs):
  """A scan whose body runs a while_loop of two steps, then a scan of 2."""
  def body(c, x):
    _, w = jax.lax.while_loop(lambda s: s[0] < 2,
                              lambda s: (s[0] + 1, s[1] + 1.0), (0, c))
    inner, _ = jax.lax.scan(lambda a, _: (a * 2.0, None), w, None, length=2)
    return inner + x, c
  return jax.lax.scan(body, x0, xs)


XS = jnp.arange(3.0)


def summary(events):
  return [(e.path, e.step, e.total, e.kind,
           jax.tree_util.tree_map(lambda v: np.asarray(v).tolist(), e.value))
          for e in events]


def same_bits(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(
      np.asarray(x).tobytes() == np.asarray(y).tobytes()
      for x, y in zip(la, lb))


@pytest.mark.usefixtures("both_modes")
def test_record_block_reports_each_step_with_its_address():
  with tap.record(select=lambda leaves: leaves[-1]) as rec:
    out = nested(jnp.float32(0.0), XS[:2])
  assert same_bits(out, nested(jnp.float32(0.0), XS[:2]))
  assert summary(rec.events) == [
      ("scan[0]/while[0]", 0, None, "carry", 1.0),
      ("scan[0]/while[0]", 1, None, "carry", 2.0),
      ("scan[0]/scan[1]", 0, 2, "carry", 4.0),
      ("scan[0]/scan[1]", 1, 2, "carry", 8.0),
      ("scan[0]", 0, 2, "carry", 8.0),
      ("scan[0]/while[0]", 0, None, "carry", 9.0),
      ("scan[0]/while[0]", 1, None, "carry", 10.0),
      ("scan[0]/scan[1]", 0, 2, "carry", 20.0),
      ("scan[0]/scan[1]", 1, 2, "carry", 40.0),
      ("scan[0]", 1, 2, "carry", 41.0),
  ]


def test_a_block_traces_a_jitted_function_for_its_own_lens():
  """A function compiled before a block, or in a block with another lens,
  is compiled again for the block's lens; blocks with equal lenses (the
  same lambda written in a loop) share its compilation."""
  doubled = jax.jit(lambda x: jax.lax.scan(
      lambda c, _: (c * 2.0, None), x, None, length=2)[0])
  doubled(jnp.float32(1.0))  # compiled before any block
  values, compilations = [], []
  for sign in (1.0, 1.0, -1.0, 1.0):
    with tap.record(select=lambda leaves: sign * leaves[0]) as rec:
      doubled(jnp.float32(1.0))
    values.append([float(e.value) for e in rec.events])
    compilations.append(doubled._cache_size())  # pylint: disable=protected-access
  assert values == [[2.0, 4.0], [2.0, 4.0], [-2.0, -4.0], [2.0, 4.0]]
  assert compilations == [2, 2, 3, 3]  # before the blocks: 1


def test_block_numbers_its_top_level_loops_in_turn_and_restores_lax():
  scan, while_loop = jax.lax.scan, jax.lax.while_loop
  with tap.record(select=lambda _: ()) as rec:
    jax.lax.scan(lambda c, _: (c, None), 0, None, length=1)
    jax.lax.while_loop(lambda c: c < 1, lambda c: c + 1, 0)
  assert [(e.path, e.step) for e in rec.events] == [("scan[0]", 0),
                                                    ("while[1]", 0)]
  assert jax.lax.scan is scan and jax.lax.while_loop is while_loop
  assert tap.original_scan is scan


@pytest.mark.usefixtures("both_modes")
def test_verbose_samples_every_kth_step_and_keeps_the_selection_s_tree():
  events = []
  g = tap.verbose(nested, on_step=events.append, sample_every=2,
                  where=lambda path: path == "scan[0]",
                  select=lambda leaves, path: {"c": leaves[0], "at": 1})
  out = jax.jit(g)(jnp.float32(0.0), XS)
  hcb.barrier_wait()
  assert same_bits(out, nested(jnp.float32(0.0), XS))
  assert summary(events) == [("scan[0]", 0, 3, "carry", {"at": 1, "c": 8.0}),
                             ("scan[0]", 2, 3, "carry",
                              {"at": 1, "c": 174.0})]


@pytest.mark.usefixtures("both_modes")
def test_events_come_in_the_program_s_order_with_its_own_taps():
  seen = []

  def f(x):
    def body(c, _):
      c = hcb.id_tap(lambda v, _: seen.append(("body", int(v))), c + 1)
      return c, None
    return jax.lax.scan(body, x, jnp.arange(2.0))[0]

  g = tap.verbose(f, on_step=lambda e: seen.append((e.path, e.step)),
                  select=lambda _: ())
  jax.jit(g)(0)
  hcb.barrier_wait()
  assert seen == [("body", 1), ("scan[0]", 0), ("body", 2), ("scan[0]", 1)]


def test_values_and_gradients_are_the_program_s():
  def f(x):
    def body(c, x):
      return jnp.sin(c) * x + c, c * x
    return jax.lax.scan(body, x, jnp.linspace(0.5, 1.5, 4))

  g = tap.verbose(f, on_step=lambda e: None, on_ys=lambda e: None)
  x = jnp.float32(0.3)
  loss = lambda h: lambda x: h(x)[0] + h(x)[1].sum()  # noqa: E731
  for transform in (jax.jit, jax.grad, lambda h: jax.grad(jax.grad(h)),
                    lambda h: jax.jit(jax.grad(h))):
    assert same_bits(transform(loss(g))(x), transform(loss(f))(x))
  xs = jnp.linspace(0.1, 0.9, 3)
  assert same_bits(jax.vmap(g)(xs), jax.vmap(f)(xs))
  assert same_bits(jax.checkpoint(loss(g))(x), jax.checkpoint(loss(f))(x))


def test_vmap_gives_each_lane_its_events_and_drops_ended_while_lanes():
  events = []

  def count_to(n):
    return jax.lax.while_loop(lambda s: s[0] < n,
                              lambda s: (s[0] + 1, s[1] * 2.0), (0, 1.0))

  jax.vmap(tap.verbose(count_to, on_step=events.append,
                       select=lambda leaves: leaves[1]))(jnp.array([1, 3]))
  assert summary(events) == [("while[0]", 0, None, "carry", 2.0),
                             ("while[0]", 0, None, "carry", 2.0),
                             ("while[0]", 1, None, "carry", 4.0),
                             ("while[0]", 2, None, "carry", 8.0)]


def test_a_warning_ends_an_error_message_with_one_period():
  def alert(event):  # NumPy's message ends with a period
    raise TypeError("isfinite requires ndarray or scalar arguments, got "
                    "<class 'tuple'> at position 0.")

  f = lambda x: jax.lax.scan(lambda c, _: (c + 1, None), x, None, length=2)  # noqa: E731
  # On a CPU device, whatever the default backend: its taps run in the
  # synchronous mode (conftest.py), so the alert warns before the call
  # returns (elsewhere only at a later barrier, outside this block).
  with pytest.warns(UserWarning) as caught, \
       jax.default_device(cpu_devices(1)[0]):
    tap.verbose(f, alert=alert)(0)
  assert str(caught[0].message) == (
      "host_callback.loops: alert raised TypeError: isfinite requires "
      "ndarray or scalar arguments, got <class 'tuple'> at position 0. The "
      "program goes on unchanged; this callback's further errors are not "
      "reported.")


def test_a_raising_callback_warns_once_and_changes_nothing():
  def bad(event):
    raise ValueError("broken")

  f = lambda x: jax.lax.scan(lambda c, _: (c + 1, None), x, None, length=3)  # noqa: E731
  with pytest.warns(UserWarning, match="on_step callback raised ValueError"):
    out = tap.verbose(f, on_step=bad, alert=lambda e: 1 / 0)(0)
  assert int(out[0]) == 3
  # Recorded, not raised: the warning's own error would be swallowed.
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tap.verbose(f, on_step=bad)(0)  # warned already: silent
  assert [str(w.message) for w in caught
          if "callback raised" in str(w.message)] == []


def test_primitive_taps_watch_nan_print_and_alerts(capfd):
  def f(x):
    def body(c, _):
      return jnp.log(c) + 0.0 * c, c
    return jax.lax.scan(body, x, None, length=3)

  with tap.record(taps=[tap.watch_nan("log", once=True),
                        tap.print("log", select=lambda out: out[0])],
                  alert=lambda e: "below zero" if e.value[0] < 0 else False,
                  where=lambda p: False) as rec:
    f(jnp.float32(2.0))
  assert [(e.path, e.step) for e in rec.events] == [
      ("scan[0]/log[0]", s) for s in (0, 0, 1, 1, 2, 2)]
  assert capfd.readouterr().err.splitlines() == [
      "[tap] scan[0]/log[0] 0/3: array(0.6931, dtype=float32)",
      "[tap] scan[0]/log[0] 1/3: array(-0.3665, dtype=float32)",
      "[tap] FAIL scan[0]/log[0] 2/3: NaN/Inf",
      "[tap] scan[0]/log[0] 2/3: array(nan, dtype=float32)",
  ]


def test_outputs_of_a_scan_go_to_on_ys():
  outputs = []
  with tap.record(select_ys=lambda ys: ys[0] * 10, on_ys=outputs.append,
                  alert_ys=lambda e: e.step == 1, alert_ys_once=True) as rec:
    jax.lax.scan(lambda c, x: (c + x, c), 0.0, jnp.arange(3.0))
  assert summary(outputs) == [("scan[0]", s, 3, "output", v)
                              for s, v in ((0, 0.0), (1, 0.0), (2, 10.0))]
  assert [e.kind for e in rec.events] == ["carry", "output"] * 3


def test_primitives_counts_every_level():
  counts = tap.primitives(nested, jnp.float32(0.0), XS)
  assert counts["scan"] == 2 and counts["while"] == 1 and counts["mul"] == 1


@jax.custom_vjp
def _clipped_sin(x):
  return jnp.sin(x)


_clipped_sin.defvjp(lambda x: (jnp.sin(x), x),
                    lambda x, g: (jnp.clip(g * jnp.cos(x), -1.0, 1.0),))


def _every_construct(x):
  """A scan whose body holds each construct the lens meets once; over its
  two steps every branch and loop body runs."""
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), ("one",))
  spec = jax.sharding.PartitionSpec()

  def body(c, step):
    m = jnp.eye(2) * (2.0 + c)
    solved = jnp.linalg.solve(m, jnp.ones(2))        # custom_linear_solve
    c = c + jnp.dot(solved, solved)                  # the one dot the lens runs
    c = jax.nn.relu(c) + _clipped_sin(c)             # custom_jvp, custom_vjp
    c = jax.lax.cond(step > 0, jnp.cos, jnp.negative, c)
    _, c = jax.lax.while_loop(  # tanh in the predicate, once round
        lambda s: (s[0] < 1) & (jnp.tanh(s[1]) < 2.0),
        lambda s: (s[0] + 1, jnp.exp(s[1])), (0, c))
    c = jax.checkpoint(jnp.log1p)(jnp.abs(c))
    c = jax.jit(jnp.sqrt)(c)
    c = jax.shard_map(jnp.sinh, mesh=mesh, in_specs=spec, out_specs=spec)(c)
    return c, None

  return jax.lax.scan(body, x, jnp.arange(2.0))[0]


def test_primitives_counts_what_on_taps():
  """`primitives` counts each primitive `on` can tap once per place in the
  program, and nothing that runs as it is: inside `custom_linear_solve`,
  custom derivatives, `shard_map` or a while predicate."""
  x = jnp.float32(0.5)
  counts = tap.primitives(_every_construct, x)
  assert counts["dot_general"] == 1  # not the solve's matvec and transpose
  for name in ("sin", "tanh", "sinh", "custom_jvp_call", "custom_vjp_call"):
    assert name not in counts, name
  for name in ("exp", "log1p", "sqrt", "cos", "custom_linear_solve"):
    assert counts[name] == 1, name
  boundaries = {"scan", "while", "cond", "remat2", "jit", "pjit",
                "closed_call"}
  tappable = sorted(set(counts) - boundaries)
  events = []
  tap.verbose(_every_construct, on_step=events.append, ops=(),
              taps=[tap.on(name) for name in tappable])(x)
  hcb.barrier_wait()
  places = {}
  for event in events:
    name = event.path.rsplit("/", 1)[-1].split("[")[0]
    places.setdefault(name, set()).add(event.path)
  assert {name: len(paths) for name, paths in places.items()} == {
      name: counts[name] for name in tappable}


def test_collectors_write_read_and_tabulate(tmp_path):
  pd = pytest.importorskip("pandas")
  path = tmp_path / "events.jsonl"
  g, rec = tap.record(lambda x: jax.lax.scan(
      lambda c, _: (c + 1.0, None), x, None, length=2))
  with collectors.JSONLWriter(path) as writer:
    tap.verbose(lambda x: jax.lax.scan(
        lambda c, _: ((c[0] + 1.0, c[1] * 2), None), x, None, length=2),
        on_step=writer)((0.0, 5))
    g(0.0)
  assert [json.loads(line)["value"] for line in path.read_text().splitlines()
          ] == [[1.0, 10], [2.0, 20]]
  assert summary(tap.read_jsonl(path)) == [
      ("scan[0]", 0, None, "carry", (1.0, 10)),
      ("scan[0]", 1, None, "carry", (2.0, 20))]
  pd.testing.assert_frame_equal(rec.df(), pd.DataFrame(
      {"path": ["scan[0]"] * 2, "step": [0, 1], "value": [1.0, 2.0]}))


@pytest.mark.parametrize("select, expected", [
    (lambda leaves: (leaves[0], leaves[0] * jnp.ones(3)),  # one array
     lambda c: (c, [c] * 3)),
    (lambda leaves: (leaves[0], leaves[0].astype(jnp.int32)),  # two dtypes
     lambda c: (c, int(c))),
    (lambda leaves: {"i": leaves[0].astype(jnp.int32)},  # an int, a dict
     lambda c: {"i": int(c)}),
    (lambda leaves: (), lambda c: ()),  # nothing: the step alone
])
@pytest.mark.usefixtures("both_modes")
def test_selected_values_of_any_layout_arrive_as_selected(select, expected):
  """Whatever the leaves of `select`'s value (one dtype or several, a
  tree, none), the event has the step and that value."""
  def loops(x):
    x = jax.lax.scan(lambda c, _: (c + 1.0, None), x, None, length=3)[0]
    return jax.lax.while_loop(lambda c: c < 5.0, lambda c: c + 1.0, x)

  g, rec = tap.record(loops, select=select)
  jax.jit(g)(jnp.float32(0))
  hcb.barrier_wait()
  got = [(e.path, e.step,
          jax.tree_util.tree_map(lambda v: np.asarray(v).tolist(), e.value))
         for e in rec.events]
  assert got == [("scan[0]", s, expected(s + 1.0)) for s in range(3)] + [
      ("while[1]", s, expected(s + 4.0)) for s in range(2)]


def test_a_tap_site_s_events_are_frozen_tap_events():
  import dataclasses
  from host_callback.loops.events import site_events
  event = site_events("scan[0]", 3, "carry")(1, 2.0, None)
  assert type(event) is tap.TapEvent
  assert event == tap.TapEvent("scan[0]", 1, 2.0, 3)
  assert dataclasses.asdict(event)["step"] == 1
  with pytest.raises(dataclasses.FrozenInstanceError):
    event.step = 2


def test_a_prng_key_selected_arrives_as_its_key_data():
  def keys(k):
    return jax.lax.scan(lambda c, _: (jax.random.split(c)[0], None), k, None,
                        length=2)[0]
  g, rec = tap.record(keys, select=lambda leaves: leaves[0])
  jax.jit(g)(jax.random.key(0))
  hcb.barrier_wait()
  assert [e.step for e in rec.events] == [0, 1]
  assert all(np.asarray(e.value).dtype == np.uint32 for e in rec.events)


@pytest.mark.usefixtures("both_modes")
@pytest.mark.parametrize("length", [1, 3, 4, 9, 12])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_sampled_scan_reports_every_kth_step_with_the_same_bits(length,
                                                                  reverse):
  """A sampled scan, forward or reversed, reports steps 0, k, 2k, ... of
  its carry, its outputs and the primitives in its body, and returns the
  same bits, outputs included."""
  def scan(x, xs, outputs=lambda c, x: c * x):
    def body(c, x):
      c = jnp.sin(c * 1.1 + x)
      return c, outputs(c, x)
    return jax.lax.scan(body, x, xs, reverse=reverse)
  xs = jnp.linspace(0.5, 2.0, length, dtype=jnp.float32)
  events, ys = [], []
  watched = tap.verbose(scan, on_step=events.append, on_ys=ys.append,
                        sample_every=4, select=lambda leaves: leaves[0],
                        select_ys=lambda leaves: leaves[0],
                        taps=[tap.on("sin", select=lambda out: out[0])])
  original = scan(jnp.float32(0.3), xs)
  out = jax.jit(watched)(jnp.float32(0.3), xs)
  hcb.barrier_wait()
  assert same_bits(out, original)
  sampled = list(range(0, length, 4))
  at = [length - 1 - i for i in sampled] if reverse else sampled
  carries = scan(jnp.float32(0.3), xs, outputs=lambda c, x: c)[1]
  assert [(e.step, np.asarray(e.value).tobytes()) for e in events
          if e.path == "scan[0]"] == [
              (step, np.asarray(carries[i]).tobytes())
              for step, i in zip(sampled, at)]
  assert [(e.step, np.asarray(e.value).tobytes()) for e in ys] == [
      (step, np.asarray(original[1][i]).tobytes())
      for step, i in zip(sampled, at)]
  assert [e.step for e in events if e.path == "scan[0]/sin[0]"] == sampled


def test_an_unsampled_step_runs_only_a_compare_and_a_cond():
  """With sample_every=k the select and the tap are all in the
  cond's taken branch: outside it the body has the step's bookkeeping
  and the user's own work only. (Running a scan's unsampled steps in an
  inner scan instead, with no cond, changed the bits of gradients: the
  cotangents of the loop's constants were summed per chunk.)"""
  def scan(x):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c), None), x, None,
                        length=10)[0]
  watched = tap.verbose(scan, on_step=lambda e: None, sample_every=5,
                        select=lambda leaves: jnp.sum(leaves[0]))
  jaxpr = jax.make_jaxpr(watched)(jnp.ones(4)).jaxpr
  body = next(e for e in jaxpr.eqns
              if e.primitive.name == "scan").params["jaxpr"].jaxpr
  outside = [e.primitive.name for e in body.eqns]
  assert outside.count("cond") == 1
  assert not {"host_callback", "reduce_sum", "concatenate"} & set(outside)
  cond = next(e for e in body.eqns if e.primitive.name == "cond")
  taken = [e.primitive.name for e in cond.params["branches"][1].jaxpr.eqns]
  assert {"host_callback", "reduce_sum"} <= set(taken)


def _sampled_scan_program(x, xs, weights):
  def body(c, x):
    c = jnp.tanh(c @ weights + x)
    return c, jnp.sum(c) * x
  c, ys = jax.lax.scan(body, x, xs)
  return jnp.sum(c) + ys.sum()


_TRANSFORMS = {
    "grad": lambda f: jax.grad(f, argnums=(0, 2)),
    "jit-grad": lambda f: jax.jit(jax.grad(f, argnums=(0, 2))),
    "grad2": lambda f: jax.grad(lambda *a: jnp.sum(jax.grad(f)(*a))),
    "vmap": lambda f: jax.vmap(f, (0, None, None)),
    "jit-vmap": lambda f: jax.jit(jax.vmap(f, (0, None, None)))}


@pytest.mark.parametrize("transform", _TRANSFORMS)
@pytest.mark.parametrize("length", [2, 3, 11, 12, 30])
def test_a_sampled_scan_keeps_the_bits_under_grad_and_vmap(transform,
                                                           length):
  """A sampled scan of a matmul returns the same bits, and the same
  gradients (the weights', summed over the steps, too)."""
  xs = jnp.linspace(0.1, 1.0, length, dtype=jnp.float32)
  weights = jax.random.normal(jax.random.key(1), (8, 8)) * 0.3
  x = jax.random.normal(jax.random.key(0), (8, 8))
  if "vmap" in transform:
    x = jnp.stack([x, 2 * x])
  watched = tap.verbose(_sampled_scan_program, on_step=lambda e: None,
                        select=lambda leaves: jnp.mean(leaves[0]),
                        sample_every=3)
  out = _TRANSFORMS[transform](watched)(x, xs, weights)
  hcb.barrier_wait()
  assert same_bits(out, _TRANSFORMS[transform](_sampled_scan_program)(
      x, xs, weights))
