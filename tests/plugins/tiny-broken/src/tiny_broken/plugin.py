"""A plugin that cannot even be imported: tiny must record the error and go on."""
raise RuntimeError("tiny-broken fails on import on purpose")
