"""Reads topics from the beginning with confluent-kafka (librdkafka's
official Python client) and prints what it read as one JSON document:

    {"messages": [{"topic", "partition", "offset", "key", "value", "headers"}]}

Keys and values are decoded as the sink's format says (`json`: parsed
JSON; a null key or value stays null). Reading stops once `--expect`
messages arrived and no more came for `--settle` seconds, or at
`--timeout` (what arrived by then is printed; the caller judges).
"""

import argparse
import base64
import datetime
import decimal
import json
import sys
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def plain(value):
    """Deserialized Avro as JSON: logical types as their ISO/decimal text,
    bytes as base64."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def decoder(fmt, registry, field):
    if fmt == "json":
        return lambda data, message: None if data is None else json.loads(data)
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry}))

    def decode(data, message):
        if data is None:
            return None
        context = SerializationContext(message.topic(), field)
        return plain(deserializer(data, context))

    return decode


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--format", default="json")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--isolation", default="read_uncommitted")
    parser.add_argument("--registry")
    args = parser.parse_args()

    consumer = Consumer(
        {
            "bootstrap.servers": args.brokers,
            "group.id": "walbridge-tests",
            "enable.auto.commit": False,
            "isolation.level": args.isolation,
        }
    )
    deadline = time.monotonic() + args.timeout
    partitions = []
    for topic in args.topic:
        while True:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is not None and metadata.error is None and metadata.partitions:
                break
            if time.monotonic() > deadline:
                print(f"topic {topic} does not exist", file=sys.stderr)
                sys.exit(3)
            time.sleep(0.2)
        partitions += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
    consumer.assign(partitions)

    from confluent_kafka.serialization import MessageField

    key_of = decoder(args.format, args.registry, MessageField.KEY)
    value_of = decoder(args.format, args.registry, MessageField.VALUE)
    messages = []
    last = time.monotonic()
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        now = time.monotonic()
        if message is None:
            if len(messages) >= args.expect and now - last >= args.settle:
                break
            continue
        if message.error():
            if message.error().code() == message.error()._PARTITION_EOF:
                continue
            print(f"consumer error: {message.error()}", file=sys.stderr)
            sys.exit(4)
        last = now
        messages.append(
            {
                "topic": message.topic(),
                "partition": message.partition(),
                "offset": message.offset(),
                "key": key_of(message.key(), message),
                "value": value_of(message.value(), message),
                "headers": {k: v.decode() for k, v in (message.headers() or [])},
            }
        )
    consumer.close()
    result = {"messages": messages}
    if args.registry:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        client = SchemaRegistryClient({"url": args.registry})
        result["subjects"] = {s: client.get_versions(s) for s in client.get_subjects()}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
