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

  def fail(self, name, nth=1, error=1):
    self.lib.hcb_standin_fail(name.encode(), nth, error)

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
  standin.fail("cudaEventQuery", 1, 600)  # not ready: the landing waits
  standin.hold(True)
  tap(standin, arrays, ordinal=1)
  standin.hold(False)
  wait_until(lambda: native.cuda_stats(1)[4] != "")
  assert "cudaEventSynchronize failed" in native.cuda_stats(1)[4]
  try:
    tap(standin, arrays, ordinal=1)
  except RuntimeError as error:
    assert "cudaEventSynchronize failed" in str(error), error
  else:
    raise AssertionError("a GPU whose event failed kept tapping")
  assert queue_stats(1)[:2] == (0, 0), queue_stats(1)


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


SCENARIOS = {f.__name__: f for f in (order, bound, failures, barrier, stop,
                                     call, large_calls, exit_pending)}

if __name__ == "__main__":
  name, library = sys.argv[1:3]
  native.attach(BOUND)
  SCENARIOS[name](StandIn(library))
  print(f"PASS {name}", flush=True)
