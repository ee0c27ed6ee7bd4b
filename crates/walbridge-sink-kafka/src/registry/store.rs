//! The embedded schema registry's state: subjects, their versions, schemas
//! by id, compatibility settings; kept in one JSON file, replaced
//! atomically on every change.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Compatibility, RegistryError, SchemaType};

/// A schema as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSchema {
    /// The schema text as registered.
    pub schema: String,
    /// Its type.
    #[serde(rename = "schemaType", default)]
    pub schema_type: SchemaType,
    /// Schemas it references (Protobuf imports, Avro named types).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<Reference>,
}

/// A reference from one schema to another registered one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    /// The name the referencing schema uses.
    pub name: String,
    /// The referenced subject.
    pub subject: String,
    /// Its version.
    pub version: i32,
}

/// One version of a subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// The version number, from 1.
    pub version: i32,
    /// The schema's global id.
    pub id: i32,
    /// Soft-deleted versions are skipped by lookups.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Schemas by id.
    schemas: BTreeMap<i32, StoredSchema>,
    /// Versions by subject.
    subjects: BTreeMap<String, Vec<Version>>,
    /// The global compatibility level.
    #[serde(default)]
    compatibility: Compatibility,
    /// Per-subject compatibility levels.
    #[serde(default)]
    subject_compatibility: BTreeMap<String, Compatibility>,
}

/// The registry's data, loaded from and saved to a file.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    state: State,
    /// Each stored schema in the form schemas compare in, computed once
    /// (for Protobuf that is a compilation).
    normalized: HashMap<i32, String>,
}

/// What a registration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The schema's id.
    pub id: i32,
    /// Its version under the subject.
    pub version: i32,
}

impl Store {
    /// Loads the registry kept at `path` (empty if the file does not exist).
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
        let state = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| RegistryError::Storage {
                path: path.to_owned(),
                reason: format!("not a schema registry file: {e}"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => {
                return Err(RegistryError::Storage {
                    path: path.to_owned(),
                    reason: e.to_string(),
                });
            }
        };
        let mut store = Store {
            path: path.to_owned(),
            state,
            normalized: HashMap::new(),
        };
        // A schema stored by a version that checked less and no longer
        // normalizes simply never matches.
        store.normalized = store
            .state
            .schemas
            .iter()
            .filter_map(|(id, schema)| Some((*id, store.normalize(schema).ok()?)))
            .collect();
        Ok(store)
    }

    fn save(&self) -> Result<(), RegistryError> {
        let storage = |e: std::io::Error| RegistryError::Storage {
            path: self.path.clone(),
            reason: e.to_string(),
        };
        let bytes = serde_json::to_vec_pretty(&self.state).map_err(|e| RegistryError::Storage {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        let temporary = self.path.with_extension("tmp");
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&temporary).map_err(storage)?;
            file.write_all(&bytes).map_err(storage)?;
            file.sync_all().map_err(storage)?;
        }
        std::fs::rename(&temporary, &self.path).map_err(storage)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(storage)?;
        }
        Ok(())
    }

    /// The compatibility level that applies to `subject`.
    pub fn compatibility(&self, subject: Option<&str>) -> Compatibility {
        subject
            .and_then(|s| self.state.subject_compatibility.get(s))
            .copied()
            .unwrap_or(self.state.compatibility)
    }

    /// The level set for `subject` itself (`None`: it follows the global one).
    pub fn subject_compatibility(&self, subject: &str) -> Option<Compatibility> {
        self.state.subject_compatibility.get(subject).copied()
    }

    /// Sets the global level, or a subject's.
    pub fn set_compatibility(
        &mut self,
        subject: Option<&str>,
        level: Compatibility,
    ) -> Result<(), RegistryError> {
        match subject {
            Some(s) => {
                self.state.subject_compatibility.insert(s.to_owned(), level);
            }
            None => self.state.compatibility = level,
        }
        self.save()
    }

    /// The schema with `id`.
    pub fn schema(&self, id: i32) -> Option<&StoredSchema> {
        self.state.schemas.get(&id)
    }

    /// Subjects with at least one live version.
    pub fn subjects(&self) -> Vec<String> {
        self.state
            .subjects
            .iter()
            .filter(|(_, versions)| versions.iter().any(|v| !v.deleted))
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// The live versions of `subject`.
    pub fn versions(&self, subject: &str) -> Result<Vec<&Version>, RegistryError> {
        let versions: Vec<&Version> = self
            .state
            .subjects
            .get(subject)
            .map(|v| v.iter().filter(|v| !v.deleted).collect())
            .unwrap_or_default();
        if versions.is_empty() {
            return Err(RegistryError::SubjectNotFound(subject.to_owned()));
        }
        Ok(versions)
    }

    /// Version `version` of `subject` (`None`: the latest).
    pub fn version(&self, subject: &str, version: Option<i32>) -> Result<&Version, RegistryError> {
        let versions = self.versions(subject)?;
        let found = match version {
            None => versions.last().copied(),
            Some(n) => versions.into_iter().find(|v| v.version == n),
        };
        found.ok_or_else(|| RegistryError::VersionNotFound {
            subject: subject.to_owned(),
            version: version.unwrap_or(-1),
        })
    }

    /// The schemas `references` name, by the names they are imported as,
    /// with the ones those reference in turn.
    fn imports(&self, references: &[Reference]) -> Result<HashMap<String, String>, RegistryError> {
        let mut imports = HashMap::new();
        let mut pending: Vec<&Reference> = references.iter().collect();
        while let Some(reference) = pending.pop() {
            if imports.contains_key(&reference.name) {
                continue;
            }
            let wanted = (reference.version != -1).then_some(reference.version);
            let schema = self
                .version(&reference.subject, wanted)
                .ok()
                .and_then(|v| self.schema(v.id))
                .ok_or_else(|| {
                    RegistryError::InvalidSchema(format!(
                        "reference `{}` names version {} of subject `{}`, which is not registered",
                        reference.name, reference.version, reference.subject
                    ))
                })?;
            imports.insert(reference.name.clone(), schema.schema.clone());
            pending.extend(&schema.references);
        }
        Ok(imports)
    }

    /// The descriptor of the Protobuf `schema`, with what it references.
    fn descriptor(
        &self,
        schema: &StoredSchema,
    ) -> Result<prost_types::FileDescriptorProto, RegistryError> {
        super::protobuf::descriptor(&schema.schema, &self.imports(&schema.references)?)
    }

    /// `schema` in the form two schemas are compared in (see
    /// [`super::normalize`]); for Protobuf, the serialized descriptor
    /// deserializers ask for.
    pub fn normalize(&self, schema: &StoredSchema) -> Result<String, RegistryError> {
        let imports = match schema.schema_type {
            SchemaType::Protobuf => self.imports(&schema.references)?,
            SchemaType::Avro | SchemaType::Json => HashMap::new(),
        };
        super::normalize(schema, &imports)
    }

    /// Deletes `version` of `subject` (`None`: all of them) and returns the
    /// version numbers deleted. A soft delete hides versions from lookups
    /// (their numbers are not reused); `permanent` removes versions that
    /// were soft-deleted before, as Confluent's registry demands, and with
    /// the subject's last version its compatibility level. Schema ids stay.
    pub fn delete(
        &mut self,
        subject: &str,
        version: Option<i32>,
        permanent: bool,
    ) -> Result<Vec<i32>, RegistryError> {
        let not_found = || RegistryError::SubjectNotFound(subject.to_owned());
        let versions = self.state.subjects.get_mut(subject).ok_or_else(not_found)?;
        let chosen = |v: &Version| version.is_none_or(|n| n == v.version);
        // A soft delete sees live versions; a permanent one all of them.
        let targets: Vec<i32> = versions
            .iter()
            .filter(|v| chosen(v) && (permanent || !v.deleted))
            .map(|v| v.version)
            .collect();
        if targets.is_empty() {
            return Err(match version {
                Some(n) if versions.iter().any(|v| !v.deleted) || permanent => {
                    RegistryError::VersionNotFound {
                        subject: subject.to_owned(),
                        version: n,
                    }
                }
                _ => not_found(),
            });
        }
        if permanent {
            if versions.iter().any(|v| chosen(v) && !v.deleted) {
                return Err(RegistryError::NotSoftDeleted {
                    subject: subject.to_owned(),
                    version,
                });
            }
            versions.retain(|v| !chosen(v));
            if versions.is_empty() {
                self.state.subjects.remove(subject);
                self.state.subject_compatibility.remove(subject);
            }
        } else {
            versions
                .iter_mut()
                .filter(|v| chosen(v))
                .for_each(|v| v.deleted = true);
            if version.is_none() {
                self.state.subject_compatibility.remove(subject);
            }
        }
        self.save()?;
        Ok(targets)
    }

    /// Where `schema` is already registered under `subject`.
    pub fn lookup(
        &self,
        subject: &str,
        schema: &StoredSchema,
    ) -> Result<Option<Registered>, RegistryError> {
        let wanted = self.normalize(schema)?;
        self.find(subject, schema.schema_type, &wanted)
    }

    /// The version of `subject` whose schema is of `schema_type` and in
    /// the form `normalized`.
    fn find(
        &self,
        subject: &str,
        schema_type: SchemaType,
        normalized: &str,
    ) -> Result<Option<Registered>, RegistryError> {
        Ok(self.versions(subject)?.into_iter().find_map(|version| {
            self.is_stored_as(version.id, schema_type, normalized)
                .then_some(Registered {
                    id: version.id,
                    version: version.version,
                })
        }))
    }

    /// True when schema `id` is of `schema_type` and in the form `normalized`.
    fn is_stored_as(&self, id: i32, schema_type: SchemaType, normalized: &str) -> bool {
        self.state
            .schemas
            .get(&id)
            .is_some_and(|s| s.schema_type == schema_type)
            && self.normalized.get(&id).is_some_and(|n| n == normalized)
    }

    /// Registers `schema` under `subject`: the existing version when it is
    /// already there, else a new version after the compatibility check.
    /// An identical schema registered elsewhere keeps its id.
    pub fn register(
        &mut self,
        subject: &str,
        schema: StoredSchema,
    ) -> Result<Registered, RegistryError> {
        let normalized = self.normalize(&schema)?;
        if self.state.subjects.contains_key(subject)
            && let Ok(Some(found)) = self.find(subject, schema.schema_type, &normalized)
        {
            return Ok(found);
        }
        let level = self.compatibility(Some(subject));
        let previous: Vec<&StoredSchema> = self
            .state
            .subjects
            .get(subject)
            .map(|versions| {
                versions
                    .iter()
                    .filter(|v| !v.deleted)
                    .filter_map(|v| self.state.schemas.get(&v.id))
                    .collect()
            })
            .unwrap_or_default();
        match schema.schema_type {
            SchemaType::Avro => {
                let previous: Vec<&StoredSchema> = previous
                    .into_iter()
                    .filter(|s| s.schema_type == SchemaType::Avro)
                    .collect();
                super::check_avro(level, &schema, &previous)?;
            }
            SchemaType::Protobuf if level != Compatibility::None => {
                let new = self.descriptor(&schema)?;
                let previous = previous
                    .into_iter()
                    .filter(|s| s.schema_type == SchemaType::Protobuf)
                    .map(|s| self.descriptor(s))
                    .collect::<Result<Vec<_>, _>>()?;
                super::check_protobuf(level, &new, &previous)?;
            }
            SchemaType::Protobuf | SchemaType::Json => {}
        }
        let existing_id = self
            .state
            .schemas
            .keys()
            .copied()
            .find(|id| self.is_stored_as(*id, schema.schema_type, &normalized));
        let id = match existing_id {
            Some(id) => id,
            None => {
                let id = self
                    .state
                    .schemas
                    .keys()
                    .next_back()
                    .map_or(1, |last| last + 1);
                self.state.schemas.insert(id, schema);
                self.normalized.insert(id, normalized);
                id
            }
        };
        let versions = self.state.subjects.entry(subject.to_owned()).or_default();
        let version = versions.last().map_or(1, |v| v.version + 1);
        versions.push(Version {
            version,
            id,
            deleted: false,
        });
        self.save()?;
        Ok(Registered { id, version })
    }
}
