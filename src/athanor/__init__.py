"""athanor: a continuous compiler for LLM inference.

docs/architecture.md maps the parts; each sub-package owns one of them: `model` (specs,
loaders, the reference forward), `engine`, `evaluate`, `traffic`, `agents`, `store`, `moves`,
`kernels`, `serve`, `loop`, `bench`; `commands` holds the CLI's subcommands.
"""

__version__ = "0.1.0"
