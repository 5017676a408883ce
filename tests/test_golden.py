"""Every case of the golden outputs of the original host_callback, byte for byte.

The expected texts are those of `spec/golden/id_print.txt` and
`spec/golden/control_flow.txt`, with the device shown as `str(device)` of the
running JAX (the golden files show the old "TFRT_CPU_<n>").
"""

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import host_callback as hcb
from helpers import captured_stdout, cpu_devices, device_str, print_blocks

# Every test here runs in the outfeed and in the synchronous mode.
pytestmark = pytest.mark.usefixtures("both_modes")

f32 = jnp.float32
i32 = jnp.int32
X = 3.  # the golden cases' x

# --- spec/golden/id_print.txt: stdout, no output_stream ---------------------

# (case id, function of no arguments, expected stdout); each function runs the
# golden case's program, under jit unless the golden case says otherwise.
ID_PRINT_CASES = [
    ("scalar_f32_jit",
     lambda: jax.jit(lambda x: hcb.id_print(x))(3.),
     "3.\n"),
    ("scalar_i32_eager",
     lambda: hcb.id_print(jnp.int32(7)),
     "7\n"),
    ("arange_f32",
     lambda: jax.jit(lambda: hcb.id_print(jnp.arange(5, dtype=f32)))(),
     "[0. 1. 2. 3. 4.]\n"),
    ("int_2d",
     lambda: jax.jit(lambda: hcb.id_print(jnp.arange(6).reshape(2, 3)))(),
     "[[0 1 2]\n [3 4 5]]\n"),
    ("bool_array",
     lambda: jax.jit(lambda: hcb.id_print(jnp.array([True, False])))(),
     "[ True False]\n"),
    ("tuple",
     lambda: jax.jit(lambda x: hcb.id_print((x, 2 * x)))(X),
     "( 3. 6. )\n"),
    ("nested_tuple_list",
     lambda: jax.jit(lambda x: hcb.id_print((x, [x + 1, (x + 2,)])))(X),
     "( 3. [ 4. ( 5. ) ] )\n"),
    ("dict",
     lambda: jax.jit(lambda x: hcb.id_print({"b": jnp.arange(3), "a": x}))(X),
     "{ a=3. b=[0 1 2] }\n"),
    ("empty_tuple",
     lambda: jax.jit(lambda: hcb.id_print(()))(),
     "(  )\n"),
    ("kwargs",
     lambda: jax.jit(lambda x: hcb.id_print(x, what="x value", other=12))(X),
     "other: 12 what: x value\n3.\n"),
    ("kwargs_tuple",
     lambda: jax.jit(lambda x: hcb.id_print((x, x * x), what="x,x^2"))(X),
     "what: x,x^2\n( 3. 9. )\n"),
    ("long_tuple_line_breaking",
     lambda: jax.jit(lambda: hcb.id_print(
         tuple(jnp.arange(8.) * i for i in range(6))))(),
     "( [0. 0. 0. 0. 0. 0. 0. 0.]\n"
     "  [0. 1. 2. 3. 4. 5. 6. 7.]\n"
     "  [ 0.  2.  4.  6.  8. 10. 12. 14.]\n"
     "  [ 0.  3.  6.  9. 12. 15. 18. 21.]\n"
     "  [ 0.  4.  8. 12. 16. 20. 24. 28.]\n"
     "  [ 0.  5. 10. 15. 20. 25. 30. 35.] )\n"),
    ("large_array_default_threshold",
     lambda: jax.jit(lambda: hcb.id_print(jnp.arange(2000, dtype=i32)))(),
     "[   0    1    2 ... 1997 1998 1999]\n"),
    ("threshold_5",
     lambda: jax.jit(lambda: hcb.id_print(jnp.arange(20, dtype=i32),
                                          threshold=5))(),
     "[ 0  1  2 ... 17 18 19]\n"),
    ("vmap",
     lambda: jax.vmap(lambda x: hcb.id_print(x, what="v"))(jnp.arange(3.)),
     "transforms: [('batch', {'batch_dims': (0,)})] what: v\n[0. 1. 2.]\n"),
    ("vmap_of_vmap",
     lambda: jax.vmap(jax.vmap(lambda x: hcb.id_print(x, what="vv")))(
         jnp.arange(4.).reshape(2, 2)),
     "transforms: [('batch', {'batch_dims': (0,)}), "
     "('batch', {'batch_dims': (0,)})] what: vv\n[[0. 1.]\n [2. 3.]]\n"),
    ("vmap_in_axes_1",
     lambda: jax.vmap(lambda x: hcb.id_print(x, what="ax1"), in_axes=1)(
         jnp.arange(6.).reshape(2, 3)),
     "transforms: [('batch', {'batch_dims': (1,)})] what: ax1\n"
     "[[0. 1. 2.]\n [3. 4. 5.]]\n"),
    # Issue 23 item 5, checked against the original (jax 0.4.30): a tap
    # whose sent values are not batched, only its result=, is not batched.
    ("vmap_only_result_batched",
     lambda: jax.vmap(lambda x: hcb.id_print(5.0, result=x, what="c"))(
         jnp.arange(3.)),
     "what: c\n5.\n"),
    ("vmap_only_result_batched_jit_scan",
     lambda: jax.vmap(jax.jit(lambda c: lax.scan(
         lambda c, x: (hcb.id_print(5.0, result=c + x, what="c"), None),
         c, jnp.arange(2.))))(jnp.arange(3.)),
     "what: c\n5.\nwhat: c\n5.\n"),
    ("vmap_of_vmap_only_result_batched",
     lambda: jax.vmap(jax.vmap(lambda x: hcb.id_print(5.0, result=x,
                                                      what="c")))(
         jnp.arange(4.).reshape(2, 2)),
     "what: c\n5.\n"),
    ("vmap_partly_batched",
     lambda: jax.vmap(lambda x: hcb.id_print((x, 5.0), what="p"))(
         jnp.arange(3.)),
     "transforms: [('batch', {'batch_dims': (0, None)})] what: p\n"
     "( [0. 1. 2.] 5. )\n"),
    ("jvp",
     lambda: jax.jvp(lambda x: hcb.id_print(x * 2, what="j"), (3.,), (0.1,)),
     "what: j\n6.\n"),
    ("grad",
     lambda: jax.grad(lambda x: hcb.id_print(x * 2, what="g"))(3.),
     "what: g\n6.\n"),
    ("tap_with_device_scalar",
     lambda: jax.jit(lambda x: hcb.id_print(x, tap_with_device=True))(X),
     "device: {dev0}\n3.\n"),
    ("tap_with_device_what_tuple",
     lambda: jax.jit(lambda x: hcb.id_print((x, x + 1), what="d",
                                            tap_with_device=True))(X),
     "device: {dev0} what: d\n( 3. 4. )\n"),
    ("tap_with_device_vmap",
     lambda: jax.vmap(lambda x: hcb.id_print(x, what="vd",
                                             tap_with_device=True))(
                                                 jnp.arange(2.)),
     "device: {dev0} transforms: [('batch', {'batch_dims': (0,)})] what: vd\n"
     "[0. 1.]\n"),
    ("scan_3_steps",
     lambda: lax.scan(lambda c, _: (hcb.id_print(c, what="c") + 1, None),
                      0., None, length=3),
     "what: c\n0.\nwhat: c\n1.\nwhat: c\n2.\n"),
]


@pytest.mark.parametrize("case,run,expected", ID_PRINT_CASES,
                         ids=[case[0] for case in ID_PRINT_CASES])
def test_id_print_golden(case, run, expected):
  del case
  with captured_stdout() as out:
    jax.block_until_ready(run())
  assert out.getvalue() == expected.replace("{dev0}", device_str(0))


def test_id_print_golden_pmap_all_devices():
  """One print per device; the order across devices is free."""
  devices = cpu_devices(4)
  with captured_stdout() as out:
    jax.block_until_ready(jax.pmap(
        lambda x: hcb.id_print(x, what="p", tap_with_device=True),
        devices=devices)(jnp.arange(4.)))
  expected = [f"device: {device} what: p\n{i}.\n"
              for i, device in enumerate(devices)]
  assert sorted(print_blocks(out.getvalue(), 2)) == sorted(expected)


def test_tap_of_unbatched_values_with_batched_result_has_no_transforms():
  """Issue 23 item 5, as the original: `seen == [(), ()]`."""
  seen = []
  xs = jnp.arange(3.)
  jax.vmap(lambda x: hcb.id_tap(lambda a, t: seen.append(t), 5.0,
                                result=x))(xs)
  jax.vmap(lambda x: hcb.id_tap(lambda a, t: seen.append(t), None,
                                result=x))(xs)
  hcb.barrier_wait()
  assert seen == [(), ()]


def test_id_print_returns_its_argument():
  """The golden cases print; they must also be the identity."""
  with captured_stdout():
    out = jax.jit(lambda x: hcb.id_print((x, [x + 1, (x + 2,)])))(X)
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(
      (0, [0, (0,)]))
  np.testing.assert_array_equal(jax.tree_util.tree_leaves(out), [3., 4., 5.])


# --- spec/golden/control_flow.txt: output_stream ------------------------------


def test_control_flow_golden_while_predicate_and_body():
  stream = io.StringIO()
  pr = lambda *a, **k: hcb.id_print(*a, output_stream=stream, **k)

  def func(x):
    x1 = pr(x, where="1")
    x2 = lax.while_loop(lambda x: pr(x < 3, where="w_p"),
                        lambda x: pr(x + 1, where="w_b"), x1)
    return pr(x2, where="3")

  assert int(jax.jit(func)(1)) == 3
  hcb.barrier_wait()
  assert stream.getvalue() == (
      "where: 1\n1\nwhere: w_p\nTrue\nwhere: w_b\n2\nwhere: w_p\nTrue\n"
      "where: w_b\n3\nwhere: w_p\nFalse\nwhere: 3\n3\n")


def test_control_flow_golden_vmap_while_batched_predicate():
  stream = io.StringIO()
  pr = lambda *a, **k: hcb.id_print(*a, output_stream=stream, **k)

  def func(x):
    x1 = pr(x, where="1")
    x2 = lax.while_loop(lambda x: pr(x < 2, where="w_c"),
                        lambda x: pr(x + 1, where="w_b"), x1)
    return pr(x2, where="3")

  out = jax.jit(jax.vmap(func))(jnp.arange(5, dtype=i32))
  hcb.barrier_wait()
  t = "transforms: [('batch', {'batch_dims': (0,)})] where: "
  assert stream.getvalue() == (
      f"{t}1\n[0 1 2 3 4]\n"
      f"{t}w_c\n[ True  True False False False]\n"
      f"{t}w_b\n[1 2 3 4 5]\n"
      f"{t}w_c\n[ True False False False False]\n"
      f"{t}w_b\n[2 3 3 4 5]\n"
      f"{t}w_c\n[False False False False False]\n"
      f"{t}3\n[2 2 2 3 4]\n")
  np.testing.assert_array_equal(out, [2, 2, 2, 3, 4])


def test_control_flow_golden_scan_with_cond():
  stream = io.StringIO()
  pr = lambda *a, **k: hcb.id_print(*a, output_stream=stream, **k)

  def body(carry, x):
    x1 = pr(x, where="s_1")
    x2 = lax.cond(x1 % 2 == 0,
                  lambda v: pr(v, where="s_t"),
                  lambda v: pr(-1, where="s_f", result=v), x1)
    return carry, pr(x2 + 1, where="s_2")

  _, ys = jax.jit(lambda xs: lax.scan(body, 0, xs))(jnp.array([1, 1]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(ys, [2, 2])
  assert stream.getvalue() == (
      "where: s_1\n1\nwhere: s_f\n-1\nwhere: s_2\n2\n"
      "where: s_1\n1\nwhere: s_f\n-1\nwhere: s_2\n2\n")


def _power3(stream):
  def power3(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=stream)
    return y * x
  return power3


def test_control_flow_golden_grad_of_checkpoint():
  stream = io.StringIO()
  power3 = _power3(stream)
  g = jax.grad(lambda x: power3(jax.checkpoint(power3)(x)))(3.)
  hcb.barrier_wait()
  assert float(g) == 9 * 3. ** 8  # d/dx x^9
  assert stream.getvalue() == ("what: x,x^2\n( 3. 9. )\n"
                               "what: x,x^2\n( 27. 729. )\n"
                               "what: x,x^2\n( 3. 9. )\n")


def test_control_flow_golden_custom_vjp_cotangents():
  stream = io.StringIO()

  @jax.custom_vjp
  def power3_with_cotangents(x):
    return _power3(stream)(x)

  def fwd(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=stream)
    return y * x, (x, y)

  def bwd(res, ct_b):
    x, y = res
    ct_x, ct_y = hcb.id_print((y * ct_b, x * ct_b), what="cotangents",
                              output_stream=stream)
    return (ct_x + 2 * x * ct_y,)

  power3_with_cotangents.defvjp(fwd, bwd)
  g = jax.grad(power3_with_cotangents)(3.)
  hcb.barrier_wait()
  assert float(g) == 27.
  assert stream.getvalue() == ("what: x,x^2\n( 3. 9. )\n"
                               "what: cotangents\n( 9. 3. )\n")


def test_control_flow_golden_pmap_of_vmap():
  stream = io.StringIO()
  m = jnp.arange(2.)[:, None] * 10 + jnp.arange(3.)[None, :]  # M[i,j]=10i+j
  f = jax.pmap(jax.vmap(lambda x: hcb.id_print(
      x * 2, what="x * 2", tap_with_device=True, output_stream=stream)),
               devices=cpu_devices(2))
  np.testing.assert_array_equal(f(m), m * 2)
  hcb.barrier_wait()
  t = "transforms: [('batch', {'batch_dims': (0,)})] what: x * 2"
  d0, d1 = cpu_devices(2)
  assert sorted(print_blocks(stream.getvalue(), 2)) == [
      f"device: {d0} {t}\n[0. 2. 4.]\n",
      f"device: {d1} {t}\n[20. 22. 24.]\n"]


def test_control_flow_golden_pmap_of_call_with_device():
  stream = io.StringIO()

  def host(x, *, device):
    stream.write(f"device: {device}\n Called with {x}\n")
    return 3 * x

  f = jax.pmap(lambda x: hcb.call(host, x * 2, result_shape=x,
                                  call_with_device=True),
               devices=cpu_devices(2))
  res = f(jnp.arange(2, dtype=i32))
  hcb.barrier_wait()
  d0, d1 = cpu_devices(2)
  assert sorted(print_blocks(stream.getvalue(), 2)) == [
      f"device: {d0}\n Called with 0\n",
      f"device: {d1}\n Called with 2\n"]
  stream.write(f"result: {res}\n")
  assert stream.getvalue().endswith("result: [0 6]\n")


def test_control_flow_golden_tap_raising_between_prints(both_modes):
  """The original ran this case in its outfeed mode only: in the synchronous
  mode a tap that raises fails the computation (tests/test_modes.py)."""
  if both_modes == "synchronous":
    pytest.skip("a raising tap fails the computation in the synchronous mode")
  stream = io.StringIO()

  def tap_raises(arg, transforms):
    raise ValueError("Some user message")

  def func(x):
    x1 = hcb.id_print(x, what="x1", output_stream=stream)
    x2 = hcb.id_tap(tap_raises, x1 + 1)
    return hcb.id_print(x2 + 1, what="x3", output_stream=stream)

  assert int(jax.jit(func)(1)) == 3
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  assert str(info.value).startswith(
      "There were exceptions during callback processing. Last one was: "
      "Traceback (most recent call last):")
  assert stream.getvalue() == "what: x1\n1\nwhat: x3\n3\n"


def test_control_flow_golden_tap_none_with_result():
  stream = io.StringIO()

  def tap_func(arg, transforms):
    stream.write(f"called tap_func with {arg} transforms={transforms}\n")

  out = jax.jit(lambda x: hcb.id_tap(tap_func, None, result=x))(5.)
  hcb.barrier_wait()
  assert float(out) == 5.
  assert stream.getvalue() == "called tap_func with None transforms=()\n"


def test_control_flow_golden_sharded_jit():
  stream = io.StringIO()
  mesh = Mesh(np.array(cpu_devices(2)), ("d",))
  x = jnp.array([[0, 1, 2], [10, 11, 12]], i32)

  def func(x):
    z = jnp.dot(x, jnp.ones((3, 4), i32))
    return hcb.id_print(z, what="z", tap_with_device=True,
                        output_stream=stream)

  out = jax.jit(func, in_shardings=NamedSharding(mesh, P("d")))(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [[3] * 4, [33] * 4])
  assert stream.getvalue() == (f"device: {cpu_devices(1)[0]} what: z\n"
                               "[[ 3  3  3  3]\n [33 33 33 33]]\n")
