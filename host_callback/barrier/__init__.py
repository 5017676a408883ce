"""`barrier_wait`: waiting until every tap and call dispatched before it has
run (`barrier`), with probes that show what a device has finished (`probes`)."""
