"""The JAX side of the receiver: host functions and what they receive
(`host_functions`), device numbers (`device_numbers`), the runtime that
connects JAX devices and host functions to the receiver (`host_side`), which
transport serves a platform (`transport_policy`, with the native handlers'
registration in `native_handlers`), listeners told when a host function's
error stops a device (`stop_listeners`), `id_print`'s formatting
(`printing`), and the terminal rows that open progress bars hold and
printing writes above (`screen`)."""
