"""The HTTP edge: FastAPI routes that validate, record a Kafka record, and answer at once.

No route ever calls a model. ``api.frame`` is what every product shares (projection base, SSE
loop, command submit, dependencies, tail, auth); ``api.conversations``, ``api.assistant`` and
``api.staff`` are the products; ``api.app.create_app`` builds the app. Never imports
``consumers`` or ``telemetry``.
"""
