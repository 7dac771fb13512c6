"""The Kafka layer of Voice: settings, the topic registry, the CloudEvents record codec, the
producer every process shares, and the dead-letter path. Nothing here knows about HTTP or models.

Public names: ``VoiceSettings``, ``TOPICS``, ``topic_name``, ``Envelope``, ``encode``, ``decode``,
``RecordProducer``, ``dead_letter``.
"""
