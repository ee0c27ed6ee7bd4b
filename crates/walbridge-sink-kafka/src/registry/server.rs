//! The embedded registry's HTTP API: the part of Confluent's REST API that
//! producers, consumers and their serializers use.
//!
//! `POST /subjects/{s}/versions`, `POST /subjects/{s}`,
//! `GET /schemas/ids/{id}`, `GET /subjects`, `GET /subjects/{s}/versions`,
//! `GET /subjects/{s}/versions/{v|latest}`, `DELETE /subjects/{s}`,
//! `DELETE /subjects/{s}/versions/{v|latest}` (soft, or `?permanent=true`),
//! `GET|PUT /config`, `GET|PUT /config/{s}`. The `GET`s of a schema take `?format=serialized`,
//! which gives a Protobuf schema as its base64 serialized descriptor.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::store::{Reference, Store, StoredSchema, Version};
use super::{Compatibility, RegistryError, SchemaType};

/// The media type of the registry's answers.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

type Shared = Arc<Mutex<Store>>;

fn lock(store: &Shared) -> MutexGuard<'_, Store> {
    // The store is only changed through methods that save before they
    // return; a panic in between leaves the in-memory copy usable.
    store.lock().unwrap_or_else(|p| p.into_inner())
}

/// An answer in the registry's media type.
struct Answer(StatusCode, Value);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(self.1)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        response
    }
}

impl From<RegistryError> for Answer {
    fn from(e: RegistryError) -> Self {
        let (status, code) = e.codes();
        Answer(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            json!({"error_code": code, "message": e.to_string()}),
        )
    }
}

type Result<T = Answer> = std::result::Result<T, Answer>;

fn ok(value: Value) -> Result {
    Ok(Answer(StatusCode::OK, value))
}

/// A registration or lookup request body.
#[derive(Deserialize)]
struct SchemaRequest {
    schema: String,
    #[serde(rename = "schemaType", default)]
    schema_type: Option<SchemaType>,
    #[serde(default)]
    references: Vec<Reference>,
}

impl From<SchemaRequest> for StoredSchema {
    fn from(r: SchemaRequest) -> Self {
        StoredSchema {
            schema: r.schema,
            schema_type: r.schema_type.unwrap_or_default(),
            references: r.references,
        }
    }
}

/// A configuration change.
#[derive(Deserialize)]
struct ConfigRequest {
    compatibility: Compatibility,
}

/// The query of the `GET`s that answer with a schema.
#[derive(Deserialize)]
struct SchemaQuery {
    /// `serialized`: a Protobuf schema as its descriptor.
    format: Option<String>,
}

/// The description of a schema: `schemaType` is left out for Avro, as
/// Confluent's registry does.
fn schema_fields(
    store: &Store,
    schema: &StoredSchema,
    query: &SchemaQuery,
    into: &mut serde_json::Map<String, Value>,
) -> std::result::Result<(), RegistryError> {
    let text = match (schema.schema_type, query.format.as_deref()) {
        (SchemaType::Protobuf, Some("serialized")) => store.normalize(schema)?,
        _ => schema.schema.clone(),
    };
    into.insert("schema".into(), Value::String(text));
    if schema.schema_type != SchemaType::Avro {
        into.insert("schemaType".into(), json!(schema.schema_type));
    }
    if !schema.references.is_empty() {
        into.insert("references".into(), json!(schema.references));
    }
    Ok(())
}

fn version_answer(store: &Store, subject: &str, version: &Version, query: &SchemaQuery) -> Result {
    let schema = store
        .schema(version.id)
        .ok_or(RegistryError::SchemaNotFound(version.id))?;
    let mut fields = serde_json::Map::new();
    fields.insert("subject".into(), json!(subject));
    fields.insert("id".into(), json!(version.id));
    fields.insert("version".into(), json!(version.version));
    schema_fields(store, schema, query, &mut fields)?;
    ok(Value::Object(fields))
}

async fn register(
    State(store): State<Shared>,
    UrlPath(subject): UrlPath<String>,
    Json(request): Json<SchemaRequest>,
) -> Result {
    let registered = lock(&store).register(&subject, request.into())?;
    ok(json!({"id": registered.id}))
}

async fn lookup(
    State(store): State<Shared>,
    UrlPath(subject): UrlPath<String>,
    Json(request): Json<SchemaRequest>,
) -> Result {
    let store = lock(&store);
    let found = store
        .lookup(&subject, &request.into())?
        .ok_or(RegistryError::SchemaNotRegistered)?;
    let version = store.version(&subject, Some(found.version))?.clone();
    version_answer(&store, &subject, &version, &SchemaQuery { format: None })
}

async fn schema_by_id(
    State(store): State<Shared>,
    UrlPath(id): UrlPath<i32>,
    Query(query): Query<SchemaQuery>,
) -> Result {
    let store = lock(&store);
    let schema = store.schema(id).ok_or(RegistryError::SchemaNotFound(id))?;
    let mut fields = serde_json::Map::new();
    schema_fields(&store, schema, &query, &mut fields)?;
    ok(Value::Object(fields))
}

async fn subjects(State(store): State<Shared>) -> Result {
    ok(json!(lock(&store).subjects()))
}

async fn versions(State(store): State<Shared>, UrlPath(subject): UrlPath<String>) -> Result {
    let store = lock(&store);
    let numbers: Vec<i32> = store
        .versions(&subject)?
        .iter()
        .map(|v| v.version)
        .collect();
    ok(json!(numbers))
}

/// A version in a URL: a number, or `latest` / `-1` (`None`).
fn parse_version(text: &str) -> std::result::Result<Option<i32>, Answer> {
    match text {
        "latest" | "-1" => Ok(None),
        number => number.parse::<i32>().map(Some).map_err(|_| {
            Answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"error_code": 42202, "message": format!("The specified version '{number}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"")}),
            )
        }),
    }
}

async fn version(
    State(store): State<Shared>,
    UrlPath((subject, version)): UrlPath<(String, String)>,
    Query(query): Query<SchemaQuery>,
) -> Result {
    let wanted = parse_version(&version)?;
    let store = lock(&store);
    let found = store.version(&subject, wanted)?.clone();
    version_answer(&store, &subject, &found, &query)
}

/// The query of the deletes.
#[derive(Deserialize)]
struct DeleteQuery {
    #[serde(default)]
    permanent: bool,
}

async fn delete_subject(
    State(store): State<Shared>,
    UrlPath(subject): UrlPath<String>,
    Query(query): Query<DeleteQuery>,
) -> Result {
    ok(json!(lock(&store).delete(
        &subject,
        None,
        query.permanent
    )?))
}

async fn delete_version(
    State(store): State<Shared>,
    UrlPath((subject, version)): UrlPath<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> Result {
    let mut store = lock(&store);
    let number = match parse_version(&version)? {
        Some(n) => n,
        None => store.version(&subject, None)?.version,
    };
    let deleted = store.delete(&subject, Some(number), query.permanent)?;
    ok(json!(deleted.first().copied().unwrap_or(number)))
}

async fn global_config(State(store): State<Shared>) -> Result {
    ok(json!({"compatibilityLevel": lock(&store).compatibility(None)}))
}

async fn subject_config(State(store): State<Shared>, UrlPath(subject): UrlPath<String>) -> Result {
    ok(json!({"compatibilityLevel": lock(&store).compatibility(Some(&subject))}))
}

async fn set_global_config(
    State(store): State<Shared>,
    Json(request): Json<ConfigRequest>,
) -> Result {
    lock(&store).set_compatibility(None, request.compatibility)?;
    ok(json!({"compatibility": request.compatibility}))
}

async fn set_subject_config(
    State(store): State<Shared>,
    UrlPath(subject): UrlPath<String>,
    Json(request): Json<ConfigRequest>,
) -> Result {
    lock(&store).set_compatibility(Some(&subject), request.compatibility)?;
    ok(json!({"compatibility": request.compatibility}))
}

async fn root() -> Result {
    ok(json!({}))
}

/// The registry's routes over the store at `path`.
pub fn router(path: &Path) -> std::result::Result<Router, RegistryError> {
    let store: Shared = Arc::new(Mutex::new(Store::open(path)?));
    Ok(Router::new()
        .route("/", get(root))
        .route("/subjects", get(subjects))
        .route("/subjects/{subject}", post(lookup).delete(delete_subject))
        .route("/subjects/{subject}/versions", get(versions).post(register))
        .route(
            "/subjects/{subject}/versions/{version}",
            get(version).delete(delete_version),
        )
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/config", get(global_config).put(set_global_config))
        .route(
            "/config/{subject}",
            get(subject_config).put(set_subject_config),
        )
        .with_state(store))
}

/// Serves `router` (see [`router`]) on `listener` until the task is
/// dropped.
pub async fn serve(listener: TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}
