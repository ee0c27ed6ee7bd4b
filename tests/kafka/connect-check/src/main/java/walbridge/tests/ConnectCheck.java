package walbridge.tests;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.debezium.transforms.ExtractNewRecordState;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Reads the kafka sink's messages as Debezium's tooling would.
 *
 * <p>Input, one per line: {@code {"topic": …, "key": <the key's JSON>, "value": <the value's
 * JSON, or null>}} as the sink wrote them with {@code json_schemas = true}. Each key and value
 * goes through Kafka Connect's {@link JsonConverter} ({@code schemas.enable = true}); the value
 * must be a Debezium change-event envelope; Debezium's {@link ExtractNewRecordState} then
 * flattens it (with {@code add.fields = op,table,lsn}). What the converter read must turn back
 * into the payload that was written (it reads a value of the wrong type silently). Output, one per line: {@code {"key":
 * <Connect JSON of the key>, "value": <Connect JSON (schema and payload) of the flattened value,
 * or null>}}. Anything that is not such an envelope stops it with exit status 2 and the reason
 * on stderr.
 */
public final class ConnectCheck {
  private ConnectCheck() {}

  /** A problem with a message's envelope. */
  static final class WrongEnvelope extends Exception {
    WrongEnvelope(String message) {
      super(message);
    }
  }

  public static void main(String[] args) throws Exception {
    ObjectMapper json = new ObjectMapper();
    JsonConverter keys = converter(true);
    JsonConverter values = converter(false);
    JsonConverter output = converter(false);
    ExtractNewRecordState<SourceRecord> flatten = new ExtractNewRecordState<>();
    flatten.configure(Map.of("add.fields", "op,table,lsn"));
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    int n = 0;
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      if (line.isBlank()) {
        continue;
      }
      n++;
      JsonNode message = json.readTree(line);
      String topic = message.get("topic").asText();
      try {
        SchemaAndValue key = keys.toConnectData(topic, bytes(json, message.get("key")));
        SchemaAndValue value = values.toConnectData(topic, bytes(json, message.get("value")));
        if (value.value() != null) {
          checkEnvelope(value.schema());
          // JsonConverter reads a value of the wrong type without a word
          // (a string where an int32 belongs becomes 0): what it read must
          // turn back into what was written.
          JsonNode back = json.readTree(output.fromConnectData(topic, value.schema(), value.value()));
          if (!same(withoutNulls(back.get("payload")), withoutNulls(message.get("value").get("payload")))) {
            throw new WrongEnvelope(
                "the payload does not match its schema: written "
                    + message.get("value").get("payload")
                    + ", read as "
                    + back.get("payload"));
          }
        }
        SourceRecord record =
            new SourceRecord(
                null, null, topic, 0, key.schema(), key.value(), value.schema(), value.value());
        SourceRecord flat = flatten.apply(record);
        ObjectNode result = json.createObjectNode();
        result.set("key", json.readTree(output.fromConnectData(topic, key.schema(), key.value())));
        if (flat == null || flat.value() == null) {
          result.putNull("value");
        } else {
          result.set(
              "value", json.readTree(output.fromConnectData(topic, flat.valueSchema(), flat.value())));
        }
        System.out.println(json.writeValueAsString(result));
      } catch (WrongEnvelope | RuntimeException e) {
        System.err.println("message " + n + " on " + topic + ": " + e.getMessage());
        System.exit(2);
      }
    }
    flatten.close();
  }

  private static JsonConverter converter(boolean isKey) {
    JsonConverter converter = new JsonConverter();
    converter.configure(Map.of("schemas.enable", "true"), isKey);
    return converter;
  }

  private static byte[] bytes(ObjectMapper json, JsonNode node) throws Exception {
    return node == null || node.isNull() ? null : json.writeValueAsBytes(node);
  }

  /** Equal, numbers by value whatever their JSON type (1 and 1.0, int and long). */
  private static boolean same(JsonNode a, JsonNode b) {
    return a.equals(
        (x, y) -> {
          if (x.isNumber() && y.isNumber()) {
            return x.decimalValue().compareTo(y.decimalValue()) == 0 ? 0 : 1;
          }
          return x.equals(y) ? 0 : 1;
        },
        b);
  }

  /** A copy without the object fields that are null (absent and null are the same to Connect). */
  private static JsonNode withoutNulls(JsonNode node) {
    if (node == null) {
      return com.fasterxml.jackson.databind.node.NullNode.getInstance();
    }
    if (node.isObject()) {
      ObjectNode copy = ((ObjectNode) node).objectNode();
      node.properties()
          .forEach(
              e -> {
                if (!e.getValue().isNull()) {
                  copy.set(e.getKey(), withoutNulls(e.getValue()));
                }
              });
      return copy;
    }
    if (node.isArray()) {
      com.fasterxml.jackson.databind.node.ArrayNode copy =
          ((com.fasterxml.jackson.databind.node.ArrayNode) node).arrayNode();
      node.forEach(element -> copy.add(withoutNulls(element)));
      return copy;
    }
    return node;
  }

  /** What Debezium's consumers rely on in an envelope's schema. */
  private static void checkEnvelope(Schema schema) throws WrongEnvelope {
    if (schema == null || schema.type() != Schema.Type.STRUCT) {
      throw new WrongEnvelope("the value is not a struct with a schema");
    }
    if (schema.name() == null || !schema.name().endsWith(".Envelope")) {
      throw new WrongEnvelope("the value's schema is named " + schema.name() + ", not *.Envelope");
    }
    Schema before = field(schema, "before", Schema.Type.STRUCT).schema();
    Schema after = field(schema, "after", Schema.Type.STRUCT).schema();
    if (!before.isOptional() || !after.isOptional()) {
      throw new WrongEnvelope("before and after must be optional");
    }
    if (!before.equals(after)) {
      throw new WrongEnvelope("before and after have different schemas");
    }
    Schema source = field(schema, "source", Schema.Type.STRUCT).schema();
    for (String name : new String[] {"connector", "name", "db", "schema", "table"}) {
      field(source, name, Schema.Type.STRING);
    }
    field(source, "ts_ms", Schema.Type.INT64);
    field(source, "lsn", Schema.Type.INT64);
    field(schema, "op", Schema.Type.STRING);
    field(schema, "ts_ms", Schema.Type.INT64);
  }

  private static Field field(Schema struct, String name, Schema.Type type) throws WrongEnvelope {
    Field field = struct.field(name);
    if (field == null) {
      throw new WrongEnvelope(struct.name() + " has no field " + name);
    }
    if (field.schema().type() != type) {
      throw new WrongEnvelope(
          struct.name() + "." + name + " is " + field.schema().type() + ", not " + type);
    }
    return field;
  }
}
