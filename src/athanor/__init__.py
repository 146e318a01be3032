"""athanor: a continuous compiler for LLM inference.

See DESIGN.md (in the project's shared folder) for the map of parts; each sub-package
owns one of them: `model` (specs, loaders, the reference forward), `engine`, `evaluate`,
`traffic`, `agents`, `store`, `plan`, `serve`, `loop`.
"""

__version__ = "0.1.0"
