//! The wire names of the policy enums, written once.
//!
//! `wire_enum!` declares a fieldless enum from a table of `Variant = "name"` rows and derives
//! from that one table everything that spells a name: `as_str` (used by `Policy::to_doc`,
//! metric labels and `Display`), `from_name` (used by `Policy::from_doc`), the list of names an
//! error message offers, and the OpenAPI schema (each variant's `#[schema(rename)]`). A new
//! variant or a renamed one therefore changes the parser, the renderer and the API document
//! together.

/// Declares an enum whose variants each have one wire name. Attributes before `pub enum` (doc
/// comments, `#[derive(Default)]`) and on variants (`#[default]`, doc comments) pass through.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $wire:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub enum $name {
            $($(#[$vmeta])* #[cfg_attr(feature = "openapi", schema(rename = $wire))] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name this variant has in policy documents.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }

            /// The variant a policy document names, if any.
            pub fn from_name(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// The names, as an error message offers them: `a, b or c`.
            pub fn expected() -> String {
                $crate::domain::wire::either(Self::ALL.iter().map(|v| v.as_str()))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::from_name(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!("expected {}", Self::expected()))
                })
            }
        }
    };
}

pub(crate) use wire_enum;

/// `a`, `a or b`, `a, b or c`.
pub fn either<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    wire_enum! {
        /// A test enum.
        pub enum Fruit {
            Apple = "apple",
            BloodOrange = "blood_orange",
            Kiwi = "kiwi",
        }
    }

    #[test]
    fn every_name_parses_back_to_its_variant() {
        for v in Fruit::ALL {
            assert_eq!(Fruit::from_name(v.as_str()), Some(*v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert_eq!(Fruit::BloodOrange.as_str(), "blood_orange");
        assert_eq!(Fruit::from_name("BloodOrange"), None);
        assert_eq!(Fruit::expected(), "apple, blood_orange or kiwi");
    }

    #[cfg(feature = "openapi")]
    #[test]
    fn the_schema_lists_the_same_names() {
        use utoipa::PartialSchema;
        let schema = serde_json::to_value(Fruit::schema()).unwrap();
        assert_eq!(
            schema["enum"],
            serde_json::json!(["apple", "blood_orange", "kiwi"])
        );
    }

    #[test]
    fn either_joins_like_a_sentence() {
        assert_eq!(either([].into_iter()), "");
        assert_eq!(either(["a"].into_iter()), "a");
        assert_eq!(either(["a", "b"].into_iter()), "a or b");
        assert_eq!(either(["a", "b", "c"].into_iter()), "a, b or c");
    }
}
