"""The Kafka layer of Voice: settings, the topic registry, the CloudEvents record codec, the
producer every process shares, the dead-letter path (``dead_letters``) and the retry policy
of every consumer (``retry``). Nothing here knows about HTTP or models.

Public names: ``VoiceSettings``, ``TOPICS``, ``topic_name``, ``Envelope``, ``encode``, ``decode``,
``RecordProducer``, ``send_dead_letter``, ``RetryPolicy``.
"""
