"""The HTTP edge: FastAPI routes that validate, record a Kafka record, and answer at once.

No route ever calls a model. Public names: ``create_app``, ``mint_token``, ``Principal``.
"""
