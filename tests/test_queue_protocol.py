"""The queue protocol, one set of scenarios for both queues: a direct run's
claim, its nesting and suspension, a guest's packet, the consumer's thread
("The queue protocol" in docs/architecture.md, which names each call).

Each test runs against the queue of the transport that the `transport`
fixture picks: the Python transport's `PacketQueue`, or the native
`DeviceQueue` through the extension's functions (`take`, `release`,
`take_as_guest`, `end_guest`, and the test-only `_testing_push` and
`_testing_*claim*`), on a device id of its own that no receiver thread
serves. A packet is known by its tag: its consumer id in Python, its site
natively.
"""

from __future__ import annotations

import _thread
import contextlib
import itertools
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import pytest

from host_callback.host import host_side
from host_callback.receiver.native_library import native
from host_callback.receiver.packets import Packet
from host_callback.receiver.queues import PacketQueue

_NOTHING_SECONDS = 0.02  # how long a take that must get nothing waits
_SOME_SECONDS = 5.0      # how long a take that must get packets may wait


class _PythonQueue:
  """The protocol's calls on a `PacketQueue`."""

  def __init__(self) -> None:
    self.queue = PacketQueue(1 << 20)
    self._batches: Dict[int, List[Packet]] = {}  # by consumer thread

  def push(self, tag: int) -> None:
    self.queue.put(Packet(consumer_id=tag, device_id=0, arrays=[]),
                   lambda: None)

  def take(self, timeout: float) -> List[int]:
    batch = self.queue.take_all(timeout)
    self._batches.setdefault(threading.get_ident(), []).extend(batch)
    return [packet.consumer_id for packet in batch]

  def finish_batch(self) -> None:
    for packet in self._batches.pop(threading.get_ident(), []):
      self.queue.mark_finished(packet)

  def take_as_guest(self) -> Optional[int]:
    packet = self.queue.take_as_guest()
    return None if packet is None else packet.consumer_id

  def __getattr__(self, name: str) -> Any:
    # claim_if_idle, end_claim, suspend_claim, resume_claim, end_guest,
    # consuming_on_this_thread: the same names.
    return getattr(self.queue, name)

  def waiting(self) -> int:
    return self.queue.packets_waiting

  def close(self) -> None:
    pass


class _NativeQueue:
  """The protocol's calls on a native `DeviceQueue`, by the extension."""

  _device_ids = itertools.count(1 << 40)  # far from any real device's
  _MAX_PACKETS = 64

  def __init__(self) -> None:
    self.device_id = next(self._device_ids)
    self._batches: Dict[int, List[int]] = {}  # packets, bytes by thread

  def _take(self, take: Callable[..., Any], *args: Any) -> np.ndarray:
    """The index rows of what `take` described, into fresh buffers."""
    dst = np.empty(1 << 16, np.uint8)
    index = np.zeros((self._MAX_PACKETS, 6), np.int64)
    count, needed = take(self.device_id, *args, dst.ctypes.data, dst.nbytes,
                         index.ctypes.data)
    assert not needed
    return index[:count]

  def push(self, tag: int) -> None:
    native._testing_push(self.device_id, tag)

  def take(self, timeout: float) -> List[int]:
    rows = self._take(lambda device, *buffers: native.take(
        device, timeout, *buffers, self._MAX_PACKETS, 0, 0))
    batch = self._batches.setdefault(threading.get_ident(), [0, 0])
    batch[0] += len(rows)
    batch[1] += int(rows[:, 3].sum())
    return [int(site) for site in rows[:, 1]]

  def finish_batch(self) -> None:
    packets, nbytes = self._batches.pop(threading.get_ident(), (0, 0))
    native.release(self.device_id, packets, nbytes)

  def take_as_guest(self) -> Optional[int]:
    rows = self._take(native.take_as_guest)
    return int(rows[0, 1]) if len(rows) else None

  def end_guest(self) -> None:
    native.end_guest(self.device_id)

  def claim_if_idle(self) -> bool:
    return native._testing_claim_if_idle(self.device_id)

  def end_claim(self) -> None:
    native._testing_end_claim(self.device_id)

  def suspend_claim(self) -> bool:
    return native._testing_suspend_claim(self.device_id)

  def resume_claim(self) -> None:
    native._testing_resume_claim(self.device_id)

  def consuming_on_this_thread(self) -> bool:
    return native._testing_consuming_on_this_thread(self.device_id)

  def waiting(self) -> int:
    return native.stats(self.device_id)[1]

  def close(self) -> None:
    """Leaves the queue drained, whatever the test left: the barriers of
    the tests that follow wait for every native queue."""
    self.end_guest()
    for _ in range(8):  # claims this thread may still hold, nested
      self.end_claim()
    for _ in range(8):
      if not self.waiting():
        return
      self.finish_batch()
      self.take(0)
      self.finish_batch()
    assert not self.waiting(), "the test left packets on its native queue"


@pytest.fixture
def queue(transport) -> Iterator[Any]:
  """A fresh queue of the transport's kind."""
  if transport == "native":
    host_side.start_receiver()  # a native push needs a receiver attached
    made: Any = _NativeQueue()
  else:
    made = _PythonQueue()
  yield made
  made.close()


def _elsewhere(call: Callable[[], Any]) -> Any:
  """What `call` returns on another thread."""
  result: List[Any] = []
  thread = threading.Thread(target=lambda: result.append(call()))
  thread.start()
  thread.join(_SOME_SECONDS)
  assert result, "the call on another thread did not return"
  return result[0]


def _claims_elsewhere(queue) -> bool:
  """Whether another thread's direct run may claim the queue now (it ends
  its claim at once)."""
  def claim_and_end() -> bool:
    claimed = queue.claim_if_idle()
    queue.end_claim()
    return claimed
  return _elsewhere(claim_and_end)


# --- Direct runs: claim_if_idle, end_claim ---


def test_a_direct_run_claims_an_idle_queue(queue):
  assert queue.claim_if_idle()
  queue.push(1)  # a tap that the direct run's host function sends
  assert queue.take(_NOTHING_SECONDS) == []  # claimed: the consumer waits
  queue.end_claim()
  assert queue.take(_SOME_SECONDS) == [1]
  queue.finish_batch()
  assert queue.waiting() == 0


def test_a_direct_run_is_refused_while_packets_wait_or_are_consumed(queue):
  queue.push(1)
  assert not queue.claim_if_idle()  # queued packets come first
  assert queue.take(_SOME_SECONDS) == [1]
  assert not queue.claim_if_idle()  # taken, not yet finished
  queue.finish_batch()
  assert queue.claim_if_idle()
  queue.end_claim()


def test_a_direct_run_is_refused_while_another_thread_holds_the_claim(queue):
  assert queue.claim_if_idle()
  assert not _claims_elsewhere(queue)
  queue.end_claim()
  assert _claims_elsewhere(queue)


def test_nested_claims_by_the_owner_deepen(queue):
  assert queue.claim_if_idle()
  assert queue.claim_if_idle()  # a direct run inside a direct run
  queue.push(1)
  queue.end_claim()
  assert queue.take(_NOTHING_SECONDS) == []  # the outer level still holds
  queue.end_claim()
  assert queue.take(_SOME_SECONDS) == [1]
  queue.finish_batch()


def test_ending_a_claim_the_thread_does_not_hold_does_nothing(queue):
  queue.end_claim()  # no claim at all
  assert queue.claim_if_idle()
  _elsewhere(queue.end_claim)  # another thread's claim
  queue.push(1)
  assert queue.take(_NOTHING_SECONDS) == []  # still claimed
  assert not _claims_elsewhere(queue)
  queue.end_claim()
  assert queue.take(_SOME_SECONDS) == [1]
  queue.finish_batch()


# --- Suspensions: suspend_claim, resume_claim ---


def test_a_suspension_lets_the_consumer_take_while_the_owner_waits(queue):
  assert queue.claim_if_idle()
  queue.push(1)  # the direct run's request of its own device
  assert queue.suspend_claim()
  assert queue.take(_SOME_SECONDS) == [1]  # the consumer answers it
  queue.finish_batch()
  queue.resume_claim()
  queue.push(2)
  assert queue.take(_NOTHING_SECONDS) == []  # claimed again
  queue.end_claim()
  assert queue.take(_SOME_SECONDS) == [2]
  queue.finish_batch()


def test_only_the_owner_suspends_an_active_claim(queue):
  assert not queue.suspend_claim()  # nothing claimed
  assert queue.claim_if_idle()
  assert not _elsewhere(queue.suspend_claim)
  assert queue.suspend_claim()
  assert not queue.suspend_claim()  # suspended already
  queue.resume_claim()
  queue.end_claim()


@contextlib.contextmanager
def _owner_elsewhere(queue) -> Iterator[Dict[str, threading.Event]]:
  """Another thread's direct run, which requests packet 1 of its device
  (suspending its claim) and resumes its claim once `resume` is set; its
  events, by name. On leaving, this thread finishes its batch."""
  events = {name: threading.Event()
            for name in ("suspended", "resume", "resuming", "resumed")}

  def owner() -> None:
    assert queue.claim_if_idle()
    queue.push(1)
    assert queue.suspend_claim()
    events["suspended"].set()
    events["resume"].wait(_SOME_SECONDS)
    events["resuming"].set()
    queue.resume_claim()  # waits for the consumer's batch
    events["resumed"].set()
    queue.end_claim()

  thread = threading.Thread(target=owner)
  thread.start()
  try:
    assert events["suspended"].wait(_SOME_SECONDS)
    yield events
  finally:
    events["resume"].set()
    queue.finish_batch()
    thread.join(_SOME_SECONDS)


def test_resuming_waits_until_the_consumer_finished_its_batch(queue):
  """The consumer may still run packets of the batch it took during the
  suspension after the one that answered the owner: the owner resumes
  only once that batch is finished, so that the device's host functions
  run one at a time."""
  with _owner_elsewhere(queue) as owner:
    assert queue.take(_SOME_SECONDS) == [1]
    owner["resume"].set()
    assert not owner["resumed"].wait(0.1)  # the batch is not finished
    queue.finish_batch()
    assert owner["resumed"].wait(_SOME_SECONDS)


def test_a_consumer_that_holds_a_batch_takes_again_while_the_owner_resumes(
    queue):
  """A host function of the consumer's batch that makes a request of its
  device (the nested consumer) is served while the owner waits to resume:
  neither waits for the other."""
  with _owner_elsewhere(queue) as owner:
    assert queue.take(_SOME_SECONDS) == [1]
    owner["resume"].set()
    assert owner["resuming"].wait(_SOME_SECONDS)
    assert not owner["resumed"].wait(0.1)  # the batch is not finished
    queue.push(2)  # the request of a host function of the batch
    assert _elsewhere(lambda: queue.take(_NOTHING_SECONDS)) == []  # active
    assert queue.take(_SOME_SECONDS) == [2]  # but the consumer takes, nested
    assert queue.consuming_on_this_thread()
    assert not owner["resumed"].is_set()
    queue.finish_batch()
    assert owner["resumed"].wait(_SOME_SECONDS)


def test_ctrl_c_ends_the_wait_to_resume(queue):
  """On Python's main thread, Ctrl-C ends the owner's wait for the consumer
  (KeyboardInterrupt), the claim active again."""
  assert threading.current_thread() is threading.main_thread()
  taken, finish, finished = (threading.Event() for _ in range(3))

  def consumer() -> None:
    assert queue.take(_SOME_SECONDS) == [1]
    taken.set()
    finish.wait(_SOME_SECONDS)
    queue.finish_batch()
    finished.set()

  assert queue.claim_if_idle()
  queue.push(1)
  assert queue.suspend_claim()
  thread = threading.Thread(target=consumer)
  thread.start()
  try:
    assert taken.wait(_SOME_SECONDS)
    returned: List[float] = []
    start = time.monotonic()
    threading.Timer(0.1, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
      queue.resume_claim()  # the consumer holds its batch
      returned.append(time.monotonic())
      time.sleep(_SOME_SECONDS)  # where a KeyboardInterrupt pending lands
    assert not returned or returned[0] >= start + 0.1  # not before Ctrl-C
    assert not finished.is_set()
    queue.push(2)
    assert _elsewhere(lambda: queue.take(_NOTHING_SECONDS)) == []  # active
  finally:
    finish.set()
    thread.join(_SOME_SECONDS)
  assert finished.is_set()
  queue.end_claim()
  assert queue.take(_SOME_SECONDS) == [2]
  queue.finish_batch()


def test_the_owner_resumes_at_once_past_a_batch_it_holds_itself(queue):
  def own_and_consume() -> bool:
    assert queue.claim_if_idle()
    queue.push(1)
    assert queue.suspend_claim()
    assert queue.take(_SOME_SECONDS) == [1]
    queue.resume_claim()  # never waits for itself
    queue.finish_batch()
    queue.end_claim()
    return True

  assert _elsewhere(own_and_consume)
  assert queue.waiting() == 0


def test_ending_a_suspended_claim_releases_the_queue(queue):
  assert queue.claim_if_idle()
  assert queue.suspend_claim()
  queue.end_claim()
  assert queue.claim_if_idle()
  queue.end_claim()


# --- Guests: take_as_guest, end_guest ---


def test_a_guest_takes_one_packet_and_claims_the_queue(queue):
  for tag in range(3):
    queue.push(tag)
  assert queue.take_as_guest() == 0
  assert queue.take(_NOTHING_SECONDS) == []  # claimed: the consumer waits
  assert queue.take_as_guest() is None  # one packet at a time
  assert not queue.claim_if_idle()  # nor a direct run
  assert not _claims_elsewhere(queue)
  queue.end_guest()
  assert queue.waiting() == 2
  assert queue.take(_SOME_SECONDS) == [1, 2]
  queue.finish_batch()


def test_a_guest_takes_nothing_from_an_empty_queue(queue):
  assert queue.take_as_guest() is None
  assert _claims_elsewhere(queue)  # it claimed nothing
  queue.push(1)
  assert queue.take(_SOME_SECONDS) == [1]
  queue.finish_batch()


def test_a_guest_takes_nothing_while_the_consumer_holds_packets(queue):
  queue.push(0)
  assert queue.take(_SOME_SECONDS) == [0]
  queue.push(1)
  assert _elsewhere(queue.take_as_guest) is None  # packet 0 is not finished
  queue.finish_batch()
  assert queue.take_as_guest() == 1
  queue.end_guest()
  assert queue.waiting() == 0


def test_a_guest_takes_nothing_while_a_claim_is_held(queue):
  assert queue.claim_if_idle()
  queue.push(0)  # a tap sent by the direct run
  assert _elsewhere(queue.take_as_guest) is None
  assert queue.suspend_claim()
  assert _elsewhere(queue.take_as_guest) is None  # suspended, still held
  queue.end_claim()
  assert queue.take_as_guest() == 0
  queue.end_guest()


def test_ending_a_guest_claim_the_thread_does_not_hold_does_nothing(queue):
  queue.push(0)
  queue.end_guest()  # no claim: nothing happens
  assert queue.take_as_guest() == 0
  _elsewhere(queue.end_guest)
  assert queue.waiting() == 1  # still the guest's
  queue.end_guest()
  queue.end_guest()  # once only
  assert queue.waiting() == 0


def test_a_guest_suspends_its_claim_for_a_request_of_its_device(queue):
  queue.push(0)
  assert queue.take_as_guest() == 0
  assert not queue.claim_if_idle()  # its own packet is not finished
  queue.push(1)  # the guest's host function's request
  assert queue.suspend_claim()
  assert queue.take(_SOME_SECONDS) == [1]
  queue.finish_batch()
  queue.resume_claim()
  queue.end_guest()
  assert queue.waiting() == 0


# --- The consumer's thread: consuming_on_this_thread ---


def test_the_consumer_is_the_thread_that_holds_a_batch(queue):
  assert not queue.consuming_on_this_thread()
  queue.push(0)
  assert queue.take(_SOME_SECONDS) == [0]
  assert queue.consuming_on_this_thread()  # its requests it serves itself
  assert not _elsewhere(queue.consuming_on_this_thread)
  queue.finish_batch()
  assert not queue.consuming_on_this_thread()


def test_the_consumer_stays_the_consumer_across_a_nested_take(queue):
  queue.push(0)
  assert queue.take(_SOME_SECONDS) == [0]
  assert queue.take(_NOTHING_SECONDS) == []  # nested: packet 0 runs still
  assert queue.consuming_on_this_thread()
  queue.push(1)
  assert _elsewhere(queue.take_as_guest) is None  # not beside packet 0
  queue.finish_batch()
  assert queue.take_as_guest() == 1
  queue.end_guest()
