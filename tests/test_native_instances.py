"""`receiver/instances.py`'s `new_instance(cls, *values)`: a slots class's
instance with its slots set in `__slots__` order and neither `__init__` nor
`__setattr__` run, as host_callback.loops makes each TapEvent; the native
module's and the pure-Python fallback's alike. And `instance_feed`, the
native consumer that makes and delivers an instance per packet (the events
of a loop's usual taps), with its Python fallback for every other call."""

import dataclasses
import gc
import sys
import weakref
from typing import Any

import pytest

from host_callback.loops.events import TapEvent
from host_callback.receiver import instances, native_library


@dataclasses.dataclass(frozen=True, slots=True)
class _Frozen:
  a: Any
  b: Any
  count: int = 0

  def __post_init__(self) -> None:
    raise AssertionError("__init__ ran")


@pytest.fixture
def new_instance(transport):
  """The native module's under the native transport's run, the fallback
  under the Python transport's (the conftest runs each test under each)."""
  if transport == "native":
    return native_library.native.new_instance
  return instances._fill_slots


def test_the_slots_hold_the_values_in_order(new_instance):
  value = object()
  made = new_instance(_Frozen, "x", value, 3)
  assert type(made) is _Frozen
  assert made.a == "x" and made.b is value and made.count == 3


def test_a_frozen_instance_stays_frozen(new_instance):
  made = new_instance(_Frozen, 1, 2, 3)
  with pytest.raises(dataclasses.FrozenInstanceError):
    made.a = 5
  assert made.a == 1


def test_an_event_equals_one_made_by_its_class(new_instance):
  made = new_instance(TapEvent, "scan[0]", 4, 2.5, 10, "carry", None)
  assert made == TapEvent("scan[0]", 4, 2.5, 10)
  assert hash(made) == hash(TapEvent("scan[0]", 4, 2.5, 10))
  assert repr(made) == repr(TapEvent("scan[0]", 4, 2.5, 10))


def test_the_values_are_held_not_copied(new_instance):
  value = [1, 2]
  before = sys.getrefcount(value)
  made = new_instance(_Frozen, value, None, 0)
  held = sys.getrefcount(value)
  assert made.a is value
  del made
  after = sys.getrefcount(value)
  assert (held, after) == (before + 1, before)


@pytest.mark.parametrize("values", [(1, 2), (1, 2, 3, 4)])
def test_a_wrong_number_of_values_is_an_error(new_instance, values):
  with pytest.raises((TypeError, ValueError)):
    new_instance(_Frozen, *values)


def test_a_class_without_slots_is_an_error(new_instance):
  class Plain:
    pass
  with pytest.raises(AttributeError, match="__slots__"):
    new_instance(Plain, 1)


# --- instance_feed -----------------------------------------------------------

@pytest.fixture
def feed_parts(transport):
  """What a feed is made of, and what its callback, `failed` and fallback
  got; under the native transport's run (the module's feed)."""
  if transport != "native":
    pytest.skip("the native module's instance_feed")
  got = {"events": [], "failed": [], "fallback": []}

  def fallback(*args, **kwargs):
    got["fallback"].append((args, kwargs))

  fallback.__name__ = "the fallback's name"
  parts = dict(cls=TapEvent, head=("scan[0]",), tail=(7, "carry"),
               devices={0: "device 0"}, callback=got["events"].append,
               failed=lambda callback, error: got["failed"].append(
                   (callback, error)), fallback=fallback)
  return parts, got


def _feed(parts):
  return native_library.native.instance_feed(*parts.values())


def test_a_feed_delivers_each_step_s_event_made_in_c(feed_parts):
  parts, got = feed_parts
  feed = _feed(parts)
  value = object()
  assert feed((3, value), 0) is None
  assert feed([0, 1.5], 0) is None
  assert got["events"] == [TapEvent("scan[0]", 3, value, 7, "carry",
                                    "device 0"),
                           TapEvent("scan[0]", 0, 1.5, 7, "carry",
                                    "device 0")]
  assert got["events"][0].value is value
  assert got["fallback"] == got["failed"] == []
  assert feed.__name__ == "the fallback's name"


@pytest.mark.parametrize("args, kwargs", [
    (((1, 2.0), 0), {"transforms": (("batch", ()),)}),
    (((1, 2.0), 0, ()), {}),
    (((-1, 2.0), 0), {}),
    (((True, 2.0), 0), {}),
    (((1.0, 2.0), 0), {}),
    (((1, 2.0, 3.0), 0), {}),
    ((iter([1, 2.0]), 0), {}),
    (((1, 2.0), 5), {}),
])
def test_a_feed_leaves_every_other_call_to_its_fallback(feed_parts, args,
                                                        kwargs):
  parts, got = feed_parts
  _feed(parts)(*args, **kwargs)
  assert got["fallback"] == [(args, kwargs)]
  assert got["events"] == []


def test_a_callback_s_exception_goes_to_failed_and_others_propagate(
    feed_parts):
  parts, got = feed_parts
  raised = ValueError("broken")

  def callback(event):
    raise raised if event.step == 1 else KeyboardInterrupt

  parts["callback"] = callback
  feed = _feed(parts)
  assert feed((1, 0.0), 0) is None
  assert got["failed"] == [(callback, raised)]
  assert raised.__traceback__ is not None
  with pytest.raises(KeyboardInterrupt):
    feed((2, 0.0), 0)
  assert len(got["failed"]) == 1


def test_a_feed_in_a_reference_cycle_is_collected(feed_parts):
  parts, _ = feed_parts

  class Held:
    pass

  held, devices = Held(), {}
  feed = _feed({**parts, "head": (held,), "devices": devices})
  devices[1] = feed  # the feed holds the dict that holds it
  alive = weakref.ref(held)
  del feed, held, devices
  gc.collect()
  assert alive() is None


def test_a_feed_checks_its_class_s_slots(feed_parts):
  parts, _ = feed_parts
  parts["tail"] = (7,)
  with pytest.raises(TypeError, match="has 6 slots, 5 values given"):
    _feed(parts)
  parts["tail"] = [7, "carry"]
  with pytest.raises(TypeError):
    _feed(parts)


def test_a_feed_outlives_the_classes_made_after_it(feed_parts):
  parts, got = feed_parts
  feed = _feed(parts)
  for i in range(64):  # each class found once, kept in the module's table
    cls = dataclasses.make_dataclass(f"Later{i}", ["a"], frozen=True,
                                     slots=True)
    assert native_library.native.new_instance(cls, i).a == i
  feed((5, 1.0), 0)
  assert got["events"] == [TapEvent("scan[0]", 5, 1.0, 7, "carry",
                                    "device 0")]


def test_a_feed_is_made_only_by_instance_feed(feed_parts):
  parts, _ = feed_parts
  with pytest.raises(TypeError):
    type(_feed(parts))()
