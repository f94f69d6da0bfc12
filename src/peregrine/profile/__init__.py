"""The throughput profiler: `peregrine profile ENV --mode env_only|trainer|trainer_eval`.

`runner` measures steady-state steps/s after a warm-up and the time split;
`machine` collects the facts an artifact needs to be comparable later
(commit, date, CPU, library versions, load); `cli` writes the JSON artifact
under artifacts/throughput/ and enforces a target. Schema: docs/profiler.md.
Nothing here is imported by `import peregrine`.
"""
