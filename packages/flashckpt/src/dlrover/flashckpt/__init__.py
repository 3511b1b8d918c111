"""dlrover.flashckpt.

Flash checkpoint: shared-memory staging, asynchronous persistence, commit protocol, storage backends
and framework adapters.
"""

__all__: list[str] = []
