"""Instances of a slots class made without running its `__init__`: one at
a time (`new_instance`), or one per packet by a consumer (`instance_feed`).
In C where the native module is built (`native/python_instances.cc`), in
Python where it is not. What the classes mean is their users' business:
nothing here knows them.

A frozen dataclass with slots sets each field in its `__init__` through
`object.__setattr__`, which costs several times more than a tuple; set
here, its slots cost about as much as one.
"""

from __future__ import annotations

from typing import Any, Callable

from .native_library import native


def _fill_slots(cls: type, *values: Any) -> Any:
  """`new_instance` where the native module is not built."""
  instance: Any = object.__new__(cls)
  for name, value in zip(getattr(cls, "__slots__"), values, strict=True):
    object.__setattr__(instance, name, value)
  return instance


# `new_instance(cls, *values)`: a new instance of `cls`, a class whose
# instances hold only `__slots__`, its slots set to `values` in the order of
# `cls.__slots__`, without running `__init__` or `__setattr__`.
new_instance: Callable[..., Any] = (
    native.new_instance if native is not None else _fill_slots)


def _python_feed(cls: type, head: tuple, tail: tuple, devices: dict,
                 callback: Callable[[Any], Any],
                 failed: Callable[[Any, Exception], Any],
                 fallback: Callable[..., Any]) -> Callable[..., Any]:
  """`instance_feed` where the native module is not built: `fallback`."""
  del cls, head, tail, devices, callback, failed
  return fallback


# `instance_feed(cls, head, tail, devices, callback, failed, fallback)`: a
# consumer `feed(arrays, device_id)` that, for `arrays` of two columns, a
# Python int >= 0 and a value, from a device that the dict `devices` holds,
# calls `callback(new_instance(cls, *head, number, value, *tail,
# devices[device_id]))`, in C with no Python frame of its own; any other
# call goes to `fallback`, the same consumer in Python, and an Exception
# from `callback` to `failed(callback, error)`. Where the module is not
# built, `fallback` itself.
instance_feed: Callable[..., Callable[..., Any]] = (
    native.instance_feed if native is not None else _python_feed)
