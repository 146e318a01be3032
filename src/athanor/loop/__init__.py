"""The controller: one compile session (`compile_session`), and the continuous watch cycle (`watch`)."""

from athanor.loop.config import CompileConfig
from athanor.loop.session import CompileReport, compile_session

__all__ = ["CompileConfig", "CompileReport", "compile_session"]
