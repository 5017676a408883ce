"""`native_library.new_instance(cls, *values)`: a slots class's instance with
its slots set in `__slots__` order and neither `__init__` nor `__setattr__`
run, as host_callback.loops makes each TapEvent; the native module's and
the pure-Python fallback's alike."""

import dataclasses
import sys
from typing import Any

import pytest

from host_callback.loops.events import TapEvent
from host_callback.receiver import native_library


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
  return native_library._fill_slots


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
