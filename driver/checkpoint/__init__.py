"""Crash-safe record of what the node prepared (``docs/checkpoint.md``).

Public: :class:`driver.checkpoint.store.Checkpoint` (one file per claim under a node-wide
lock, the PrepareStarted journal, allocation history) and the record models of
:mod:`driver.checkpoint.records` (``ClaimRecord``, ``AllocationRecord``, ``CheckpointData``).
:mod:`driver.checkpoint.files` (the on-disk layout), :mod:`~driver.checkpoint.view` (the parsed
copy a process keeps), :mod:`~driver.checkpoint.parse` (documents to records) and
:mod:`~driver.checkpoint.holds` (claims whose file was corrupt) serve the store.
"""
