"""Observability that never slows training.

`peregrine.monitor.metrics` holds the fixed-layout metrics file the trainer
writes through a memory map (`MetricsWriter`) and any process reads
(`MetricsReader`); `peregrine.monitor.dashboard` renders it with Rich;
`peregrine.cli.monitor` is `peregrine monitor`; `peregrine.monitor.plots`
draws the learning curve at the end of a run.

Nothing here is imported by `import peregrine`.
"""
