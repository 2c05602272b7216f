"""Checkpoint files: `io` (clear errors for unreadable files, writes and copies that never leave a
half-written file), `safety` (what torch's weights_only loader must allow to read fairseq checkpoints),
`convert` (the names a checkpoint records, rewritten between our implementations and fairseq's),
`export_checks` (what CTranslate2's converter cannot take: mismatched data-bins, unrepresentable options).
`patches.install()` applies io's wraps and safety's allowlist when the package is imported."""
