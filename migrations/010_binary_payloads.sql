-- Binary payloads: an event whose body is not JSON (Protocol Buffers, Avro)
-- keeps its bytes in payload_bytes and its media type in content_type; the
-- relay publishes the bytes unchanged with that content-type. Its payload
-- column holds JSON null (payload stays NOT NULL, as producers that write
-- JSON rely on). content_type may also name the media type of a JSON
-- payload (application/cloudevents+json, say); NULL is application/json, or
-- application/octet-stream for bytes. Both columns are nullable, so every
-- existing row stays as it is, and adding them rewrites nothing.
ALTER TABLE outbox ADD COLUMN payload_bytes bytea, ADD COLUMN content_type text;
COMMENT ON COLUMN outbox.payload_bytes IS 'The message body as bytes, for payloads that are not JSON; payload is JSON null then.';
COMMENT ON COLUMN outbox.content_type IS 'The message''s content-type; NULL: application/json, or application/octet-stream with payload_bytes.';
