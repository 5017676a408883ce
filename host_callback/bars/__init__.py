"""Progress bars for jitted loops: the decorators that put the taps on the
device (`decorators`, public as `host_callback.tqdm`), the host side that
keeps a tqdm bar per loop, bar and device (`progress`); they draw into the
terminal rows of `host_callback.host.screen`."""
