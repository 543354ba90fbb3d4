"""Crash-safe record of what the node prepared (``docs/checkpoint.md``).

Public: :class:`driver.checkpoint.store.Checkpoint` (one file per claim under a node-wide
lock, the PrepareStarted journal, allocation history) and the record models of
:mod:`driver.checkpoint.records` (``ClaimRecord``, ``AllocationRecord``, ``CheckpointData``).
:mod:`driver.checkpoint.files` (the on-disk layout), :mod:`~driver.checkpoint.view` (the parsed
copy a process keeps), :mod:`~driver.checkpoint.reader` (the directory read into it),
:mod:`~driver.checkpoint.parse` (documents to records), :mod:`~driver.checkpoint.status` (how a
load found the checkpoint), :mod:`~driver.checkpoint.started` (the PrepareStarted journal),
:mod:`~driver.checkpoint.history` (the ended claims' records), :mod:`~driver.checkpoint.holds`
(claims whose file was corrupt), :mod:`~driver.checkpoint.spares` (claim files kept for reuse)
and :mod:`~driver.checkpoint.legacy` (the single file of earlier plugins) serve the store.
"""
