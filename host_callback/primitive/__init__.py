"""The primitive `host_callback_p` and everything about it: its rules
(`primitive`), its eager use (`eager`), the ordering token's top-level scope
(`ordering`), the count of executions (`executions`), and its lowering
(`lowering`: where the op runs, one device, each device (`each_device`) or
each shard (`partitioned`); then the transport's op, `lowering_native` or
`lowering_python`, of a `lowering_kinds` kind)."""
