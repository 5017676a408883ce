"""Scenarios of the CUDA transport's host side against the CUDA stand-in,
one per process (the stand-in is installed process-wide, and one scenario
ends the interpreter with copies pending): run by
tests/test_cuda_transport.py as `python scenarios.py NAME LIBRARY`.

"Device memory" is NumPy arrays on the host; a tap or call is made as the
CUDA handlers make them (the extension's `_testing_cuda_tap` and
`_testing_cuda_call`), and a consumer takes the GPU's queue as the receiver
does. Each scenario asserts, and prints "PASS <name>" at its end.
"""

import ctypes
import sys
import threading
import time

import numpy as np

from host_callback.receiver import native_library, native_memory

native = native_library.native
QUEUE_BASE = native.CUDA_QUEUE_BASE
HEADER = 64           # packet.h:kHeaderBytes
BOUND = 64 << 20


class StandIn:
  """The stand-in's controls (tests/cuda_standin/standin.cc)."""

  def __init__(self, path):
    self.lib = ctypes.CDLL(path)
    self.lib.hcb_standin_stream.restype = ctypes.c_void_p
    for name in ("pending", "violations", "calls", "host_blocks"):
      getattr(self.lib, "hcb_standin_" + name).restype = ctypes.c_longlong
    native._testing_cuda_standin(path)
    self.stream = self.lib.hcb_standin_stream()

  def hold(self, on):
    self.lib.hcb_standin_hold(int(on))

  def delay_us(self, us):
    self.lib.hcb_standin_delay_us(us)

  def fail(self, name, nth=1):
    """The nth call of `name` from now fails (cudaErrorInvalidValue)."""
    self.lib.hcb_standin_fail(name.encode(), nth, 1)

  def pending(self):
    return self.lib.hcb_standin_pending()

  def violations(self):
    return self.lib.hcb_standin_violations()

  def calls(self, name):
    return self.lib.hcb_standin_calls(name.encode())


KEPT = []  # "device memory" lives until the process ends, as on a stream


def tap(standin, arrays, ordinal=0, site=7):
  KEPT.extend(arrays)
  native._testing_cuda_tap(ordinal, standin.stream, site,
                           [(a.ctypes.data, a.nbytes) for a in arrays])


def take(ordinal=0, timeout=2.0):
  """The packets waiting on the GPU's queue: (site, request id, bytes); a
  tap's in a pinned block, a call's request (queued as on CPU) either way."""
  index = np.zeros((64, 6), np.int64)
  dst = np.zeros(1 << 16, np.uint8)
  count, _ = native.take(QUEUE_BASE + ordinal, timeout, dst.ctypes.data,
                         dst.nbytes, index.ctypes.data, 64, 0, 0)
  packets, total = [], 0
  for offset, site, request, size, block, address in index[:count]:
    if block:
      raw = ctypes.string_at(int(address), int(size))
      native_memory.return_block(int(block))
    else:
      assert request != 0, "a GPU tap outside a pinned block"
      raw = dst[offset:offset + size].tobytes()
    packets.append((int(site), int(request), raw))
    total += int(size)
  native.release(QUEUE_BASE + ordinal, count, total)
  return packets


def take_n(n, ordinal=0, timeout=10.0):
  packets, deadline = [], time.monotonic() + timeout
  while len(packets) < n:
    assert time.monotonic() < deadline, f"{len(packets)} of {n} packets came"
    packets += take(ordinal, 0.2)
  return packets


def value(raw):
  return int(np.frombuffer(raw[HEADER:HEADER + 8], np.int64)[0])


def wait_until(done, timeout=10.0):
  deadline = time.monotonic() + timeout
  while not done():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.005)


def settled(standin, ordinal=0):
  """Nothing pending on the stand-in's streams nor in the landing."""
  wait_until(lambda: standin.pending() == 0 and
             native.cuda_stats(ordinal)[2] == 0)


def queue_stats(ordinal=0):
  """(bytes, packets outstanding, high water, packets ever)."""
  return native.stats(QUEUE_BASE + ordinal)


def order(standin):
  """Many taps in flight, landing late and out of step: delivered in order,
  with their bytes; a block reused only after its copy completed; an idle
  landing thread burns no CPU."""
  standin.delay_us(300)
  rng = np.random.default_rng(0)
  n = 300
  for round_ in range(2):
    sizes = rng.choice([1, 3, 1000, 40_000], n)
    expected = [np.arange(s, dtype=np.int64) + i for i, s in enumerate(sizes)]
    got, in_flight = [], []

    def consume():
      while len(got) < n:
        in_flight.append(native.cuda_stats(0)[2])
        got.extend(take(0, 0.2))

    consumer = threading.Thread(target=consume)
    consumer.start()
    for array in expected:
      tap(standin, [array])
    consumer.join(60)
    assert len(got) == n, len(got)
    for i, (site, request, raw) in enumerate(got):
      assert site == 7 and request == 0
      data = np.frombuffer(raw[HEADER:HEADER + expected[i].nbytes], np.int64)
      np.testing.assert_array_equal(data, expected[i])
    assert max(in_flight) > 1, max(in_flight)  # several taps were in flight
    settled(standin)
    assert standin.violations() == 0
    assert native.cuda_pool_stats()[2] == 0  # no block out
    if round_ == 0:
      allocated = standin.calls("cudaHostAlloc")
  # The second round reused the first's blocks.
  assert standin.calls("cudaHostAlloc") - allocated < n
  assert queue_stats()[1] == 0
  start = time.process_time()
  time.sleep(0.5)
  assert time.process_time() - start < 0.1  # idle: nothing spins


def bound(standin):
  """The queue bound counts copies in flight: a device waits for room while
  its copies have not landed, and goes on once they are consumed."""
  native.attach(1 << 20)
  standin.hold(True)
  arrays = [np.full(256 << 10 >> 3, i, np.int64) for i in range(8)]
  sender = threading.Thread(target=lambda: [tap(standin, [a]) for a in arrays])
  sender.start()
  wait_until(lambda: native.cuda_stats(0)[0] == 3)
  time.sleep(0.3)
  assert sender.is_alive()
  assert native.cuda_stats(0)[0] == 3  # the 4th waits for room
  nbytes, outstanding, _, _ = queue_stats()
  assert outstanding == 3 and nbytes <= 1 << 20, (outstanding, nbytes)
  assert standin.pending() == 6  # 3 copies and 3 events
  standin.hold(False)
  got = take_n(8)
  sender.join(10)
  assert [value(raw) for _, _, raw in got] == list(range(8))
  native.attach(BOUND)


FAILING = (("cudaMemcpyAsync", 2), ("cudaEventRecord", 1),
           ("cudaHostAlloc", 1), ("cudaEventCreateWithFlags", 1))


def failures(standin):
  """A failing CUDA call fails the tap with an error that names it, and
  leaves nothing half-done: the packet's room is given back, its block is
  freed once no copy can write it, and the next tap is delivered."""
  standin.delay_us(2000)
  arrays = [np.arange(10, dtype=np.int64) + k for k in range(3)]
  for i, (name, nth) in enumerate(FAILING):
    # A GPU with no event made yet, and a tap larger than any free block:
    # the failing call is made.
    ordinal = 2 + i
    big = [np.zeros(1 << (18 + i), np.uint8)]
    standin.fail(name, nth)
    try:
      tap(standin, arrays + big, ordinal)
    except RuntimeError as error:
      assert f"{name} failed (cudaErrorInvalidValue" in str(error), error
    else:
      raise AssertionError(f"{name} failing did not fail the tap")
    settled(standin, ordinal)
    assert queue_stats(ordinal)[:2] == (0, 0), queue_stats(ordinal)
    assert native.cuda_pool_stats()[2] == 0  # no block out
    assert standin.violations() == 0
    tap(standin, [np.array([100 + i], np.int64)], ordinal)
    (_, _, raw), = take_n(1, ordinal)
    assert value(raw) == 100 + i
  # A failed event stops that GPU's transport, with an error naming it.
  standin.fail("cudaEventSynchronize", 1)
  standin.hold(True)  # the copy waits, so the landing's wait is made
  tap(standin, arrays, ordinal=1)
  wait_until(lambda: native.cuda_stats(1)[4] != "")
  standin.hold(False)
  assert "cudaEventSynchronize failed" in native.cuda_stats(1)[4]
  try:
    tap(standin, arrays, ordinal=1)
  except RuntimeError as error:
    assert "cudaEventSynchronize failed" in str(error), error
  else:
    raise AssertionError("a GPU whose event failed kept tapping")
  wait_until(lambda: queue_stats(1)[:2] == (0, 0))  # the room given back


def barrier(standin):
  """Waiting for finished packets waits for copies still in flight."""
  standin.hold(True)
  for i in range(5):
    tap(standin, [np.array([i], np.int64)])
  got = []
  consumer = threading.Thread(target=lambda: got.extend(take_n(5)))
  consumer.start()
  assert not native.wait_finished(QUEUE_BASE, 5, 0.3)
  standin.hold(False)
  consumer.join(10)
  assert [value(raw) for _, _, raw in got] == list(range(5))
  take(0, 0.01)  # releases the last batch
  assert native.wait_finished(QUEUE_BASE, 5, 5.0)


def stop(standin):
  """A receiver that stops while copies are in flight is told that packets
  are left; the next one gets them, in order."""
  standin.hold(True)
  for i in range(3):
    tap(standin, [np.array([i], np.int64)])
  assert native.detach()  # packets left: copies in flight
  standin.hold(False)
  settled(standin)
  native.attach(BOUND)
  assert [value(raw) for _, _, raw in take_n(3)] == [0, 1, 2]


def call(standin):
  """A call: its arguments copied in (the device waits for that copy only),
  the host's answer copied out to the device's results, its blocks freed
  after their copies."""
  standin.delay_us(500)
  tap(standin, [np.array([1], np.int64)])  # a tap before it, in flight
  argument = np.arange(4, dtype=np.float32)
  result = np.zeros(4, np.float32)
  got = []

  def consume():
    packets = take_n(2)
    got.extend(packets)
    (_, request, raw) = packets[1]
    answer = np.frombuffer(raw[HEADER:HEADER + 16], np.float32) * 2
    native.reply(request, [answer])

  consumer = threading.Thread(target=consume)
  consumer.start()
  KEPT.extend([argument, result])
  native._testing_cuda_call(0, standin.stream, 8,
                            [(argument.ctypes.data, argument.nbytes)],
                            [(result.ctypes.data, result.nbytes)])
  consumer.join(10)
  assert value(got[0][2]) == 1 and got[1][0] == 8 and got[1][1] != 0
  settled(standin)  # the copy out landed
  np.testing.assert_array_equal(result, argument * 2)
  assert native.cuda_pool_stats()[2] == 0
  assert standin.violations() == 0


def large_calls(standin):
  """Calls whose arguments and results together hold more than the queue
  bound and its slack: the pool keeps both blocks, so that the calls after
  the first pin no new host memory (pinning it again for each call made a
  256 MiB call's round trip take 250 ms on an H200)."""
  n = 20 << 20  # 80 MiB of float32 each way; the bound is 64 MiB
  argument = np.arange(n, dtype=np.float32)
  result = np.zeros(n, np.float32)
  KEPT.extend([argument, result])

  def one_call():
    def consume():
      (_, request, raw) = take_n(1)[0]
      native.reply(request, [np.frombuffer(raw[HEADER:HEADER + 4 * n],
                                           np.float32)])
    consumer = threading.Thread(target=consume)
    consumer.start()
    native._testing_cuda_call(0, standin.stream, 8,
                              [(argument.ctypes.data, argument.nbytes)],
                              [(result.ctypes.data, result.nbytes)])
    consumer.join(30)
    settled(standin)

  one_call()
  pinned = standin.calls("cudaHostAlloc")
  for _ in range(3):
    one_call()
  assert standin.calls("cudaHostAlloc") == pinned, (
      standin.calls("cudaHostAlloc"), pinned)
  np.testing.assert_array_equal(result, argument)
  assert standin.violations() == 0


def exit_pending(standin):
  """The interpreter exits with copies pending and the landing thread
  waiting for them: the process ends normally."""
  standin.hold(True)
  for i in range(3):
    tap(standin, [np.array([i], np.int64)])
  assert standin.pending() == 6


class _DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
              ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
              ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
              ("lanes", ctypes.c_uint16),
              ("shape", ctypes.POINTER(ctypes.c_int64)),
              ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _Versioned(ctypes.Structure):
  _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
              ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
              ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


def dlpack_tensor(capsule, versioned):
  """(data, device, shape, (code, bits), read-only flag) of a capsule."""
  get = ctypes.pythonapi.PyCapsule_GetPointer
  get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                ctypes.c_char_p]
  if versioned:
    managed = _Versioned.from_address(get(capsule, b"dltensor_versioned"))
    tensor, flags = managed.dl_tensor, managed.flags
  else:
    tensor, flags = _DLTensor.from_address(get(capsule, b"dltensor")), None
  return (tensor.data, (tensor.device_type, tensor.device_id),
          tuple(tensor.shape[i] for i in range(tensor.ndim)),
          (tensor.code, tensor.bits), flags)


def gpu_view(buffer):
  """A NumPy view of a stand-in GPU buffer (host memory), through its
  __cuda_array_interface__."""
  interface = buffer.__cuda_array_interface__
  dtype = np.dtype(interface["typestr"])
  count = int(np.prod(interface["shape"], dtype=np.int64))
  raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(
      interface["data"][0])
  return np.frombuffer(raw, dtype).reshape(interface["shape"])


class StandInGpuArray:
  """An array on stand-in GPU 0, as CuPy's would export it: host memory."""

  def __init__(self, array, stream, gpu=0):
    self.array, self.stream, self.gpu = array, stream, gpu
    KEPT.append(array)

  def __dlpack_device__(self):
    return 2, self.gpu

  @property
  def __cuda_array_interface__(self):
    return {"shape": self.array.shape, "typestr": self.array.dtype.str,
            "data": (self.array.ctypes.data, False), "version": 3,
            "strides": None, "stream": self.stream}


def buffers_site(func, result, site_arrays):
  """A buffers=True call's site of `func`, with the JAX side's consumer,
  run directly as the runtime runs it."""
  import jax  # pylint: disable=import-outside-toplevel
  from host_callback import api  # pylint: disable=import-outside-toplevel
  from host_callback.host import host_functions  # pylint: disable=import-outside-toplevel
  from host_callback.receiver import device_buffers, native_sites, native_wire  # pylint: disable=import-outside-toplevel
  treedef, avals = api._result_avals(result)  # pylint: disable=protected-access
  function = host_functions.BuffersCallParams(
      func=func, arg_treedef=jax.tree_util.tree_structure(0),
      result_treedef=treedef, result_avals=avals, copy=False,
      fills_out=api._accepts(func, "out"),  # pylint: disable=protected-access
      with_stream=api._accepts(func, "stream"))  # pylint: disable=protected-access
  consumer = host_functions.make_consumer(function, (), lambda number: None)

  def run(entry, device_id, args, outputs=None, stream=None):
    del entry
    RUNS.append(type(args[0]).__name__)
    return consumer(args, device_id, outputs, stream)

  native.set_direct_runner(run, native_wire.wire_array,
                           device_buffers.CudaBuffer)
  return native_sites.register_site(
      len(RUNS) + 100, [a.dtype for a in site_arrays],
      [a.shape for a in site_arrays], name=func.__name__, copy=False,
      packed_results=False, buffers=True)


RUNS = []  # the type of each direct run's first argument


def buffers_call(standin, func, argument, result, stream=None):
  """`func` called with buffers=True on stand-in GPU 0: the result."""
  site = buffers_site(func, result, [argument])
  KEPT.extend([argument, result])
  native._testing_cuda_call(0, stream or standin.stream, site,
                            [(argument.ctypes.data, argument.nbytes)],
                            [(result.ctypes.data, result.nbytes)])
  settled(standin)
  return result


def check_exports(x, stream):
  """An operand's exports: DLPack (both kinds) and the interface."""
  interface = x.__cuda_array_interface__
  assert interface["data"][1] is True and interface["stream"] == stream
  for versioned in (False, True):
    capsule = x.__dlpack__(stream=stream,
                           max_version=(1, 0) if versioned else None)
    data, device, shape, dtype, flags = dlpack_tensor(capsule, versioned)
    assert (data, device, shape, dtype) == (
        interface["data"][0], (2, 0), x.shape, (2, 32)), capsule
    assert flags == (1 if versioned else None)  # read-only
  assert x.__dlpack_device__() == (2, 0)


def buffers(standin):
  """A buffers=True call on an idle GPU queue runs on the GPU's buffers:
  DLPack and __cuda_array_interface__ exports with the device pointers and
  the stream, `stream=`, out= filled in place (no copy at all), a returned
  GPU array copied on the device (on its stream, or after waiting for a
  foreign one), and the errors: a result not on the GPU or of another
  dtype, a kept buffer. Behind taps in flight, it waits for them and runs
  on the GPU's buffers after them."""
  argument = np.arange(6, dtype=np.float32)
  copies = standin.calls("cudaMemcpyAsync")
  pinned = standin.calls("cudaHostAlloc")

  def double(x, *, out, stream):
    assert type(x).__name__ == "CudaBuffer" and stream == standin.stream
    check_exports(x, stream)
    gpu_view(out)[...] = gpu_view(x) * 2

  result = buffers_call(standin, double, argument, np.zeros(6, np.float32))
  np.testing.assert_array_equal(result, argument * 2)
  assert standin.calls("cudaMemcpyAsync") == copies  # nothing copied
  assert standin.calls("cudaHostAlloc") == pinned
  assert RUNS == ["CudaBuffer"]

  for stream, waits in ((standin.stream, 0), (standin.lib.hcb_standin_stream(),
                                              2)):
    synced = standin.calls("cudaStreamSynchronize")

    def plus_one(x, made_on=stream):
      return StandInGpuArray(gpu_view(x) + 1, made_on)

    result = buffers_call(standin, plus_one, argument,
                          np.zeros(6, np.float32))
    np.testing.assert_array_equal(result, argument + 1)
    assert standin.calls("cudaStreamSynchronize") - synced == waits
  assert standin.calls("cudaMemcpyAsync") == copies + 2  # one D2D each
  assert standin.violations() == 0
  buffers_errors(standin, argument)
  buffers_behind_taps(standin, argument)


def buffers_errors(standin, argument):
  """Results the consumer refuses, naming result_shape; a kept buffer."""
  wrong = {
      "DLPack device (1, 0)": lambda x: np.zeros(6, np.float32),
      "int32[6] where result_shape expects float32[6]":
          lambda x: StandInGpuArray(np.zeros(6, np.int32), standin.stream),
      "DLPack device (2, 1)":
          lambda x: StandInGpuArray(np.zeros(6, np.float32), None, gpu=1),
  }
  for message, func in wrong.items():
    try:
      buffers_call(standin, func, argument, np.zeros(6, np.float32))
    except RuntimeError as error:
      assert message in str(error) and "result_shape" in str(error), error
    else:
      raise AssertionError(f"not refused: {message}")
  kept = []

  def keep(x, *, out):
    del out
    kept.append(x.__dlpack__(stream=-1))

  try:
    buffers_call(standin, keep, argument, np.zeros(6, np.float32))
  except RuntimeError as error:
    assert "kept a GPU buffer" in str(error), error
  else:
    raise AssertionError("a kept GPU buffer did not fail the call")


def buffers_behind_taps(standin, argument):
  """Taps in flight before a buffers=True call: the call waits until they
  are consumed (their copies landed, the receiver ran and released them),
  then runs on the GPU's buffers with the stream, after them."""
  RUNS.clear()
  events = []
  standin.hold(True)
  for i in range(3):
    tap(standin, [np.array([i], np.int64)])
  result = np.zeros(6, np.float32)

  def double(x, *, out, stream):
    events.append(("call", type(x).__name__, type(out).__name__, stream))
    gpu_view(out)[...] = gpu_view(x) * 2

  caller = threading.Thread(target=buffers_call, args=(
      standin, double, argument, result))
  caller.start()
  time.sleep(0.2)
  assert caller.is_alive() and events == []  # the taps are in flight
  standin.hold(False)
  index = np.zeros((64, 6), np.int64)
  dst = np.zeros(1 << 16, np.uint8)
  deadline = time.monotonic() + 10
  while sum(event[0] == "tap" for event in events) < 3:
    assert time.monotonic() < deadline, events
    count, _ = native.take(QUEUE_BASE, 0.2, dst.ctypes.data, dst.nbytes,
                           index.ctypes.data, 64, 0, 0)
    for _, _, request, size, block, address in index[:count]:
      if request:  # the call was queued: answered, so that it returns
        events.append(("request",))
        native.reply(int(request), [np.zeros(6, np.float32)])
        continue
      events.append(("tap", value(ctypes.string_at(int(address),
                                                   int(size)))))
      native_memory.return_block(int(block))
    time.sleep(0.05)  # still consuming: the call waits
    events.append(("released", count))
    native.release(QUEUE_BASE, count, int(index[:count, 3].sum()))
  caller.join(10)
  assert not caller.is_alive()
  taps = [event for event in events if event[0] == "tap"]
  assert taps == [("tap", 0), ("tap", 1), ("tap", 2)], events
  assert events[-2][0] == "released" and events[-1] == (
      "call", "CudaBuffer", "CudaBuffer", standin.stream), events
  assert RUNS == ["CudaBuffer"], RUNS
  np.testing.assert_array_equal(result, argument * 2)
  assert standin.violations() == 0


SCENARIOS = {f.__name__: f for f in (order, bound, failures, barrier, stop,
                                     call, large_calls, exit_pending,
                                     buffers)}

if __name__ == "__main__":
  name, library = sys.argv[1:3]
  native.attach(BOUND)
  SCENARIOS[name](StandIn(library))
  print(f"PASS {name}", flush=True)
