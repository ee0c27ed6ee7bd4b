/// A PostgreSQL object identifier.
pub type Oid = u32;

/// What kind of type a `pg_type` row describes (`typtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypeKind {
    /// An ordinary base type (`b`), including arrays.
    Base,
    /// A composite (row) type (`c`).
    Composite,
    /// A domain over another type (`d`).
    Domain,
    /// An enum (`e`).
    Enum,
    /// A pseudo-type (`p`).
    Pseudo,
    /// A range type (`r`).
    Range,
    /// A multirange type (`m`).
    Multirange,
}

impl TypeKind {
    /// The kind for a `pg_type.typtype` character, if it is one PostgreSQL defines.
    pub fn from_typtype(c: u8) -> Option<Self> {
        Some(match c {
            b'b' => TypeKind::Base,
            b'c' => TypeKind::Composite,
            b'd' => TypeKind::Domain,
            b'e' => TypeKind::Enum,
            b'p' => TypeKind::Pseudo,
            b'r' => TypeKind::Range,
            b'm' => TypeKind::Multirange,
            _ => return None,
        })
    }
}

/// A row of `pg_type`, as much of it as walbridge needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    /// The type's OID.
    pub oid: Oid,
    /// Schema of the type (`pg_catalog` for built-ins).
    pub schema: String,
    /// The type's name (`typname`; arrays are `_elem`).
    pub name: String,
    /// `typtype`.
    pub kind: TypeKind,
    /// For arrays, the element type (`typelem` where `typsubscript` is the array one).
    pub element: Option<Oid>,
    /// For domains, the underlying type (`typbasetype`).
    pub base: Option<Oid>,
    /// Array element delimiter (`typdelim`), `,` for almost everything.
    pub delimiter: u8,
}

/// How a column's values are to be interpreted when converting them to
/// other formats. Domains are classified by their base type; arrays carry
/// the classification of their elements.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// `bool`.
    Bool,
    /// `int2`.
    Int2,
    /// `int4`.
    Int4,
    /// `int8`.
    Int8,
    /// `oid` (an unsigned 32-bit integer).
    Oid,
    /// `float4`.
    Float4,
    /// `float8`.
    Float8,
    /// `numeric`, arbitrary precision.
    Numeric,
    /// `text`, `varchar`, `bpchar`, `name`, `char` and other character types.
    Text,
    /// `bytea`.
    Bytea,
    /// `date`.
    Date,
    /// `time` without time zone.
    Time,
    /// `timetz`.
    TimeTz,
    /// `timestamp` without time zone.
    Timestamp,
    /// `timestamptz`.
    TimestampTz,
    /// `interval`.
    Interval,
    /// `uuid`.
    Uuid,
    /// `json`.
    Json,
    /// `jsonb`.
    Jsonb,
    /// A user-defined enum.
    Enum,
    /// A composite (row) type.
    Composite,
    /// A range or multirange.
    Range,
    /// An array of `element`, written with `delimiter` between elements.
    Array {
        /// Classification of the elements.
        element: Box<ValueKind>,
        /// Delimiter in the text form (`typdelim`).
        delimiter: u8,
    },
    /// Anything else: carried and rendered in its text form.
    Other,
}

impl ValueKind {
    /// The classification of a built-in scalar type by OID, or `None` for
    /// types that need a catalog lookup (arrays, domains, user types).
    pub fn builtin(oid: Oid) -> Option<Self> {
        Some(match oid {
            16 => ValueKind::Bool,
            17 => ValueKind::Bytea,
            18 | 19 | 25 | 1042 | 1043 => ValueKind::Text,
            20 => ValueKind::Int8,
            21 => ValueKind::Int2,
            23 => ValueKind::Int4,
            26 => ValueKind::Oid,
            114 => ValueKind::Json,
            700 => ValueKind::Float4,
            701 => ValueKind::Float8,
            1082 => ValueKind::Date,
            1083 => ValueKind::Time,
            1114 => ValueKind::Timestamp,
            1184 => ValueKind::TimestampTz,
            1186 => ValueKind::Interval,
            1266 => ValueKind::TimeTz,
            1700 => ValueKind::Numeric,
            2950 => ValueKind::Uuid,
            3802 => ValueKind::Jsonb,
            _ => return None,
        })
    }

    /// The classification of an array of a built-in scalar type by the
    /// array type's OID (`_int4` is 1007), or `None` for other types.
    pub fn builtin_array(oid: Oid) -> Option<Self> {
        let element = match oid {
            1000 => 16,
            1001 => 17,
            1002 => 18,
            1003 => 19,
            1009 => 25,
            1014 => 1042,
            1015 => 1043,
            1016 => 20,
            1005 => 21,
            1007 => 23,
            1028 => 26,
            199 => 114,
            1021 => 700,
            1022 => 701,
            1182 => 1082,
            1183 => 1083,
            1115 => 1114,
            1185 => 1184,
            1187 => 1186,
            1270 => 1266,
            1231 => 1700,
            2951 => 2950,
            3807 => 3802,
            _ => return None,
        };
        Some(ValueKind::Array {
            element: Box::new(ValueKind::builtin(element)?),
            delimiter: b',',
        })
    }
}
