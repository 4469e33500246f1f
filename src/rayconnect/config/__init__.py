"""The pipelines' settings Structs (sink, source, placement): checked when built, plain data
after that. Low in the package order - actors, tables and pipelines all read them, and they
import none of those."""
