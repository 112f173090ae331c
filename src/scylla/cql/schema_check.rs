//! Checks CQL text against the migrations' schema without a server: the tables and columns a
//! statement names exist, every partition-key column is bound, and the Rust types the code
//! binds and reads are the columns' CQL types. A wrong column or type would otherwise only
//! show up as a failed `prepare` or a type-check error against a live cluster.
//!
//! Test-only: a parser of the few CQL shapes quotad writes, not of CQL.

use scylla::value::{Counter, CqlTimestamp, MaybeUnset};

#[derive(Debug, Clone)]
pub struct SchemaTable {
    pub name: String,
    pub columns: Vec<(String, String)>,
    pub partition_key: Vec<String>,
    pub clustering: Vec<String>,
}

impl SchemaTable {
    pub fn column_type(&self, c: &str) -> Option<&str> {
        self.columns
            .iter()
            .find(|(n, _)| n == c)
            .map(|(_, t)| t.as_str())
    }
}

/// The CQL type a Rust value binds or reads as.
pub trait CqlName {
    const NAME: &'static str;
}
macro_rules! cql_name {
    ($($t:ty => $n:literal),* $(,)?) => { $(impl CqlName for $t { const NAME: &'static str = $n; })* };
}
cql_name!(i8 => "tinyint", i16 => "smallint", i32 => "int", i64 => "bigint",
    &str => "text", String => "text", Counter => "counter", CqlTimestamp => "timestamp",
    bool => "boolean");
impl CqlName for &[i64] {
    const NAME: &'static str = "list<bigint>";
}
impl CqlName for &[&str] {
    const NAME: &'static str = "list<text>";
}
impl<T: CqlName> CqlName for Option<T> {
    const NAME: &'static str = T::NAME;
}
impl<T: CqlName> CqlName for MaybeUnset<T> {
    const NAME: &'static str = T::NAME;
}

/// The CQL types of a tuple of bind values or a row type, in order.
pub trait CqlNames {
    fn names() -> Vec<&'static str>;
}
macro_rules! cql_names {
    ($($t:ident),+) => {
        impl<$($t: CqlName),+> CqlNames for ($($t,)+) {
            fn names() -> Vec<&'static str> { vec![$($t::NAME),+] }
        }
    };
}
impl CqlNames for () {
    fn names() -> Vec<&'static str> {
        Vec::new()
    }
}
cql_names!(A);
cql_names!(A, B);
cql_names!(A, B, C);
cql_names!(A, B, C, D);
cql_names!(A, B, C, D, E);
cql_names!(A, B, C, D, E, F);
cql_names!(A, B, C, D, E, F, G);
cql_names!(A, B, C, D, E, F, G, H);
cql_names!(A, B, C, D, E, F, G, H, I);
cql_names!(A, B, C, D, E, F, G, H, I, J);
cql_names!(A, B, C, D, E, F, G, H, I, J, K);
cql_names!(A, B, C, D, E, F, G, H, I, J, K, L);
cql_names!(A, B, C, D, E, F, G, H, I, J, K, L, M);
cql_names!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);

pub fn names<T: CqlNames>() -> Vec<&'static str> {
    T::names()
}

/// Splits CQL into words, `?`, quoted strings and punctuation (`>=`, `<=` kept whole).
pub fn tokens(cql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let cs: Vec<char> = cql.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let j = (i..cs.len())
                .find(|&j| !(cs[j].is_ascii_alphanumeric() || cs[j] == '_'))
                .unwrap_or(cs.len());
            out.push(cs[i..j].iter().collect());
            i = j;
        } else if c == '\'' {
            let j = (i + 1..cs.len())
                .find(|&j| cs[j] == '\'')
                .unwrap_or(cs.len() - 1);
            out.push(cs[i..=j].iter().collect());
            i = j + 1;
        } else if (c == '>' || c == '<') && cs.get(i + 1) == Some(&'=') {
            out.push(format!("{c}="));
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// The tables created by a set of CQL statements.
pub fn parse_tables(statements: &[String]) -> Vec<SchemaTable> {
    let mut out = Vec::new();
    for s in statements {
        let t = tokens(s);
        let upper: Vec<String> = t.iter().map(|w| w.to_ascii_uppercase()).collect();
        if upper.len() < 3 || upper[0] != "CREATE" || upper[1] != "TABLE" {
            continue;
        }
        let open = t.iter().position(|w| w == "(").expect("a table body");
        let name = t[open - 1].clone();
        // Split the body at top-level commas.
        let mut items: Vec<Vec<String>> = vec![Vec::new()];
        let mut depth = 0;
        for w in &t[open + 1..] {
            match w.as_str() {
                "(" => depth += 1,
                ")" if depth == 0 => break,
                ")" => depth -= 1,
                "," if depth == 0 => {
                    items.push(Vec::new());
                    continue;
                }
                _ => {}
            }
            items.last_mut().unwrap().push(w.clone());
        }
        let mut table = SchemaTable {
            name,
            columns: Vec::new(),
            partition_key: Vec::new(),
            clustering: Vec::new(),
        };
        for item in items {
            if item.len() >= 2
                && item[0].eq_ignore_ascii_case("PRIMARY")
                && item[1].eq_ignore_ascii_case("KEY")
            {
                // PRIMARY KEY ((a, b), c, d) or PRIMARY KEY (a, c)
                let inner = &item[3..item.len() - 1];
                if inner[0] == "(" {
                    let close = inner.iter().position(|w| w == ")").unwrap();
                    table.partition_key = inner[1..close]
                        .iter()
                        .filter(|w| *w != ",")
                        .cloned()
                        .collect();
                    table.clustering = inner[close + 1..]
                        .iter()
                        .filter(|w| *w != ",")
                        .cloned()
                        .collect();
                } else {
                    let cols: Vec<String> = inner.iter().filter(|w| *w != ",").cloned().collect();
                    table.partition_key = vec![cols[0].clone()];
                    table.clustering = cols[1..].to_vec();
                }
            } else {
                table
                    .columns
                    .push((item[0].clone(), item[1].to_ascii_lowercase()));
                if item.len() >= 4 && item[2].eq_ignore_ascii_case("PRIMARY") {
                    table.partition_key = vec![item[0].clone()];
                }
            }
        }
        out.push(table);
    }
    out
}

const KEYWORDS: &[&str] = &[
    "SELECT", "DISTINCT", "FROM", "WHERE", "AND", "UPDATE", "SET", "INSERT", "INTO", "VALUES",
    "DELETE", "IF", "NOT", "EXISTS", "LIMIT", "TOKEN", "USING", "TTL", "NULL", "IN",
];

/// The column a marker inside the right-hand tuple of a multi-column relation binds:
/// in `(a, b) < (?, ?)` the first marker binds `a`, the second `b`. None for any other marker.
fn tuple_column(t: &[String], i: usize) -> Option<String> {
    let open = (0..i).rev().find(|&j| t[j] == "(")?;
    if t[open + 1..i].iter().any(|w| w != "?" && w != ",") {
        return None;
    }
    let op = t.get(open.checked_sub(1)?)?;
    if !["=", ">", "<", ">=", "<="].contains(&op.as_str()) || t.get(open.checked_sub(2)?)? != ")" {
        return None;
    }
    let left_open = (0..open - 2).rev().find(|&j| t[j] == "(")?;
    let cols: Vec<&String> = t[left_open + 1..open - 2]
        .iter()
        .filter(|w| *w != ",")
        .collect();
    let place = t[open + 1..i].iter().filter(|w| *w == "?").count();
    cols.get(place).map(|c| (*c).clone())
}

/// Checks one statement; returns a description of the first problem.
pub fn check(
    tables: &[SchemaTable],
    cql: &str,
    binds: &[&str],
    row: Option<&[&str]>,
) -> Result<(), String> {
    let t = tokens(cql);
    let upper: Vec<String> = t.iter().map(|w| w.to_ascii_uppercase()).collect();
    let kw = |i: usize, k: &str| upper.get(i).is_some_and(|w| w == k);
    let table_at = match upper[0].as_str() {
        "SELECT" | "DELETE" => upper.iter().position(|w| w == "FROM").map(|i| i + 1),
        "UPDATE" => Some(1),
        "INSERT" => Some(2),
        _ => None,
    }
    .ok_or("unknown statement kind")?;
    let table = tables
        .iter()
        .find(|tb| tb.name == t[table_at])
        .ok_or_else(|| format!("no table {}", t[table_at]))?;
    let is_counter_table = table.columns.iter().any(|(_, ty)| ty == "counter");
    if is_counter_table && upper.iter().any(|w| w == "USING") {
        return Err("USING (TTL/TIMESTAMP) is refused on counter tables".into());
    }
    if upper.iter().any(|w| w == "TIMESTAMP") {
        return Err("quotad never sets write timestamps".into());
    }
    // `USING TTL ?` binds an int, wherever it stands.
    let ttl_marker = upper
        .windows(2)
        .position(|w| w[0] == "TTL" && w[1] == "?")
        .map(|i| i + 1);
    if is_counter_table && upper[0] == "INSERT" {
        return Err("INSERT is refused on counter tables".into());
    }
    // Every identifier is a keyword, the table, or one of its columns.
    for (i, w) in t.iter().enumerate() {
        if i == table_at || !is_ident(w) || KEYWORDS.contains(&upper[i].as_str()) {
            continue;
        }
        if table.column_type(w).is_none() {
            return Err(format!("no column {w} in {}", table.name));
        }
    }
    // What each marker binds.
    let mut bound: Vec<String> = Vec::new();
    if upper[0] == "INSERT" {
        let cols: Vec<&String> = t[table_at + 2..]
            .iter()
            .take_while(|w| *w != ")")
            .filter(|w| *w != ",")
            .collect();
        let markers = t.iter().filter(|w| *w == "?").count() - ttl_marker.iter().count();
        if markers != cols.len() {
            return Err(format!("{} columns, {markers} markers", cols.len()));
        }
        for c in &cols {
            bound.push(table.column_type(c).unwrap().to_owned());
        }
        if ttl_marker.is_some() {
            bound.push("int".to_owned());
        }
        for pk in table.partition_key.iter().chain(&table.clustering) {
            if !cols.contains(&pk) {
                return Err(format!("key column {pk} not inserted"));
            }
        }
    } else {
        for (i, w) in t.iter().enumerate() {
            if w != "?" {
                continue;
            }
            let prev = upper[i - 1].as_str();
            let ty = if let Some(col) = tuple_column(&t, i) {
                // (a, b) < (?, ?): the marker binds its place's column on the left.
                table
                    .column_type(&col)
                    .ok_or_else(|| format!("marker for {col}"))?
                    .to_owned()
            } else if prev == "LIMIT" || Some(i) == ttl_marker {
                "int".to_owned()
            } else if prev == "IN" {
                // `c IN ?` binds a list of the column's type.
                let ty = table
                    .column_type(&t[i - 2])
                    .ok_or_else(|| format!("marker after {}", t[i - 2]))?;
                format!("list<{ty}>")
            } else if prev == "+" {
                table.column_type(&t[i - 2]).unwrap().to_owned()
            } else if ["=", ">", "<", ">=", "<="].contains(&prev) {
                if t[i - 2] == ")" {
                    // token(...) > ?: Murmur3 tokens are bigints.
                    "bigint".to_owned()
                } else {
                    table
                        .column_type(&t[i - 2])
                        .ok_or_else(|| format!("marker after {}", t[i - 2]))?
                        .to_owned()
                }
            } else {
                return Err(format!("cannot tell what marker {i} binds"));
            };
            bound.push(ty);
        }
        // Every partition-key column bound by equality (or all of them inside token()); a
        // SELECT may list the last one's values with IN instead.
        // A SELECT without WHERE is a deliberate full scan (tiny bookkeeping tables only).
        let where_at = match upper.iter().position(|w| w == "WHERE") {
            Some(i) => i,
            None if upper[0] == "SELECT" => t.len() - 1,
            None => return Err("no WHERE".into()),
        };
        let end = upper
            .iter()
            .rposition(|w| w == "IF")
            .filter(|&i| i > where_at);
        let clause = &t[where_at + 1..end.unwrap_or(t.len())];
        let eq: Vec<&String> = clause
            .windows(3)
            .filter(|w| w[1] == "=" && w[2] == "?")
            .map(|w| &w[0])
            .collect();
        // `c IN ?` on the last partition-key column: a read of many partitions, which the
        // code sends to a replica of all of them (it cannot be routed by token).
        let listed: Vec<&String> = clause
            .windows(3)
            .filter(|w| w[1].eq_ignore_ascii_case("IN") && w[2] == "?")
            .map(|w| &w[0])
            .collect();
        if where_at == t.len() - 1 {
            // Full scan: nothing to bind.
        } else if kw(where_at + 1, "TOKEN") {
            let args: Vec<&String> = clause[2..]
                .iter()
                .take_while(|w| *w != ")")
                .filter(|w| *w != ",")
                .collect();
            if args
                .iter()
                .map(|s| s.as_str())
                .ne(table.partition_key.iter().map(|s| s.as_str()))
            {
                return Err(format!(
                    "token() over {args:?}, key is {:?}",
                    table.partition_key
                ));
            }
        } else {
            let last = table.partition_key.last();
            for pk in &table.partition_key {
                let is_in = upper[0] == "SELECT" && Some(pk) == last && listed.contains(&pk);
                if !eq.contains(&pk) && !is_in {
                    return Err(format!("partition-key column {pk} not bound by ="));
                }
            }
        }
    }
    if bound != binds {
        return Err(format!("markers bind {bound:?}, the code binds {binds:?}"));
    }
    if let Some(row) = row {
        let from = upper
            .iter()
            .position(|w| w == "FROM")
            .ok_or("SELECT without FROM")?;
        let start = if kw(1, "DISTINCT") { 2 } else { 1 };
        let selected: Vec<&str> = t[start..from]
            .iter()
            .filter(|w| *w != ",")
            .map(|w| table.column_type(w).unwrap_or("?"))
            .collect();
        if selected != row {
            return Err(format!("selects {selected:?}, the code reads {row:?}"));
        }
    } else if upper[0] == "SELECT" {
        return Err("a SELECT without a row type".into());
    }
    Ok(())
}
