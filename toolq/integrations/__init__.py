"""Drop-in toolq tools for agent frameworks: one module per framework.

Each module imports its framework; this package imports none, so
``import toolq`` never loads a framework. Install the matching extra
(``toolq[openai-agents]``, ``toolq[langchain]``, ``toolq[pydantic-ai]``,
``toolq[anthropic]``) and import the module you use.
"""
