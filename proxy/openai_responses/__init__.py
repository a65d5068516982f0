"""OpenAI's Responses API over Weir's chat path: models, translation, store, events."""

from .routes import setup

__all__ = ["setup"]
