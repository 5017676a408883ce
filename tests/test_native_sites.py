"""The native transport's site table, `receiver/native_sites.py`, lays out each
site's arrays (`native_wire.column`), and the module's `register_site`
copies that layout into the two C++ tables that need it without Python's
help, `SiteSizes` (the byte sizes the device threads check) and
`python_sites` (what the direct runner builds arrays of). These tests check
that both copies say what the owner says, and forget a site with it
("The native parts" in docs/architecture.md)."""

import ml_dtypes
import numpy as np
import pytest

from host_callback.receiver import native_library, native_sites
from host_callback.receiver.native_library import native

_LAYOUTS = {
    "scalars and matrices": ([np.float32, np.int64, np.bool_],
                             [(), (2, 3), (7,)]),
    "sub-byte, packed": ([ml_dtypes.int4, ml_dtypes.uint2, np.uint8],
                         [(5,), (3, 3), (0,)]),
    "bfloat16": ([ml_dtypes.bfloat16], [(4, 1)]),
}


@pytest.fixture(autouse=True)
def native_only(transport):
  if transport != "native" or not native_library.available():
    pytest.skip("the native transport's site tables")


def _register(dtypes, shapes, **options):
  return native_sites.register_site(
      consumer_id=10**9, dtypes=dtypes, shapes=shapes,
      name="test_native_sites", **{"copy": True, "packed_results": False,
                                   "buffers": False, **options})


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_the_module_s_two_copies_say_what_native_sites_says(layout):
  dtypes, shapes = _LAYOUTS[layout]
  site_id = _register(dtypes, shapes, copy=False,
                      packed_results=True, buffers=True)
  try:
    site = native_sites.sites[site_id]
    sizes = [column.nbytes for column in site.columns]
    runner = native._testing_runner_site(site_id)
    assert runner is not None
    (r_dtypes, r_shapes, r_sizes, r_unpackers, r_ints, r_copy, r_pack,
     r_buffers) = runner
    assert r_dtypes == [column.dtype for column in site.columns]
    assert r_shapes == [column.shape for column in site.columns]
    assert r_sizes == sizes
    assert [u is not None for u in r_unpackers] == [
        column.packed_bits is not None for column in site.columns]
    assert r_ints == list(site.ints) == [False] * len(site.columns)
    assert (r_copy, r_pack, r_buffers) == (not site.read_only, True, True)
    # The devices' copy: the sizes, and that the site takes buffers.
    assert native._testing_check_site_sizes(site_id, sizes) is site.buffers
    with pytest.raises(RuntimeError, match="expects arrays of"):
      native._testing_check_site_sizes(site_id, sizes[:-1] + [sizes[-1] + 1])
  finally:
    native_sites.sites.unregister(site_id)


def test_both_copies_forget_a_site_with_native_sites():
  site_id = _register([np.float32], [(3,)])
  native_sites.sites.unregister(site_id)
  assert site_id not in native_sites.sites
  assert native._testing_runner_site(site_id) is None
  with pytest.raises(RuntimeError, match="is not registered"):
    native._testing_check_site_sizes(site_id, [12])
