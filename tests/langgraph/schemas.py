"""Tools and a schema the structured-output tests share."""

from __future__ import annotations

from langchain_core.tools import tool
from pydantic import BaseModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


class Person(BaseModel):
    """A person."""

    name: str
    age: int
    job: str = ""
