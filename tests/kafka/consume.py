"""Reads topics from the beginning with confluent-kafka (librdkafka's
official Python client) and prints what it read as one JSON document:

    {"messages": [{"topic", "partition", "offset", "key", "value", "headers"}]}

Keys and values are decoded as the sink's format says (`json`: parsed
JSON; `avro` and `protobuf`: confluent-kafka's deserializers with the
registry, every field of a Protobuf message listed, unset ones as null; a
null key or value stays null). Protobuf message classes are made the way a
consumer makes them: the subject's latest schema text, compiled by protoc
(grpcio-tools). Reading stops once `--expect`
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


def proto_plain(message):
    """A Protobuf message as JSON: every field (unset ones null),
    timestamps and decimals as their ISO/decimal text, bytes as base64."""
    from confluent_kafka.schema_registry.protobuf import protobuf_to_decimal

    name = message.DESCRIPTOR.full_name
    if name == "google.protobuf.Timestamp":
        return message.ToDatetime(tzinfo=datetime.timezone.utc).isoformat()
    if name == "confluent.type.Decimal":
        return str(protobuf_to_decimal(message))
    result = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.is_repeated:
            result[field.name] = [
                proto_plain(v) if field.message_type else plain(v) for v in value
            ]
        elif field.has_presence and not message.HasField(field.name):
            result[field.name] = None
        elif field.message_type:
            result[field.name] = proto_plain(value)
        else:
            result[field.name] = plain(value)
    return result


def protoc_message_class(registry, subject, message_names, version):
    """The class of the first of `message_names` in version `version`
    (None: the latest) of `subject`, compiled from its text by protoc, as
    a consumer's build would."""
    import os
    import subprocess
    import tempfile

    import grpc_tools
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.confluent.type import decimal_pb2
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    client = SchemaRegistryClient({"url": registry})
    registered = client.get_version(subject, version) if version else client.get_latest_version(subject)
    schema = registered.schema
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "schema.proto"), "w") as f:
            f.write(schema.schema_str)
        builtins = descriptor_pb2.FileDescriptorSet()
        decimal_pb2.DESCRIPTOR.CopyToProto(builtins.file.add())
        with open(os.path.join(work, "builtins.pb"), "wb") as f:
            f.write(builtins.SerializeToString())
        compiled = os.path.join(work, "schema.pb")
        include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{work}", f"-I{include}",
             f"--descriptor_set_in={os.path.join(work, 'builtins.pb')}",
             "--include_imports", f"--descriptor_set_out={compiled}", "schema.proto"],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet()
        with open(compiled, "rb") as f:
            files.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    package = next(f.package for f in files.file if f.name == "schema.proto")
    # Table topics hold Key and Envelope; message and sequence topics
    # their own pair (MessageKey/MessageValue, SequenceKey/SequenceValue).
    for name in message_names:
        try:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        except KeyError:
            continue
    raise KeyError(f"none of {message_names} in {subject}")


def decoder(fmt, registry, field, schema_version):
    if fmt == "json":
        return lambda data, message: None if data is None else json.loads(data)
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry})
    if fmt == "avro":
        avro = AvroDeserializer(client)
        deserializer = lambda data, topic: plain(avro(data, SerializationContext(topic, field)))
    else:
        protobuf = {}

        def deserializer(data, topic):
            # The class is made when the topic's first message arrives, from
            # the chosen version; messages of every version decode with it.
            if topic not in protobuf:
                is_key = field == MessageField.KEY
                message_class = protoc_message_class(
                    registry,
                    f"{topic}-{'key' if is_key else 'value'}",
                    ["Key", "MessageKey", "SequenceKey"] if is_key
                    else ["Envelope", "MessageValue", "SequenceValue"],
                    schema_version,
                )
                protobuf[topic] = ProtobufDeserializer(message_class, {}, schema_registry_client=client)
            return proto_plain(protobuf[topic](data, SerializationContext(topic, field)))

    def decode(data, message):
        if data is None:
            return None
        return deserializer(data, message.topic())

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
    parser.add_argument("--schema-version", type=int)
    # librdkafka properties for the connection (security.protocol, sasl.*, ssl.*).
    parser.add_argument("--property", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    settings = {
        "bootstrap.servers": args.brokers,
        "group.id": "walbridge-tests",
        "enable.auto.commit": False,
        "isolation.level": args.isolation,
    }
    for prop in args.property:
        key, _, value = prop.partition("=")
        settings[key] = value
    consumer = Consumer(settings)
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

    key_of = decoder(args.format, args.registry, MessageField.KEY, args.schema_version)
    value_of = decoder(args.format, args.registry, MessageField.VALUE, args.schema_version)
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
