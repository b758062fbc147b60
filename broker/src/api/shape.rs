//! The wire shape of each served request, walked before the codec decodes it.
//!
//! Why: the codec sizes a `Vec` from an array's declared length before reading its elements,
//! so four random bytes can ask for hundreds of gigabytes, and a failed allocation aborts the
//! process. Walking the request first proves every array's elements are really in the frame,
//! which bounds every allocation by the frame size (itself capped by `socket.request.max.bytes`).
//! The shapes follow Kafka's message schemas; tagged fields are skipped by their sizes.

/// A field's wire type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    I8,
    I16,
    I32,
    I64,
    Uuid,
    /// STRING / COMPACT_STRING, nullable or not.
    Str,
    /// BYTES / RECORDS, compact in flexible versions.
    Bytes,
    /// An array of INT32.
    Ints,
    /// An array of INT64.
    Longs,
    /// An array of strings.
    Strs,
    /// An array of structs.
    Structs(&'static [Field]),
}

/// A field present in versions `from..=to`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    ty: Ty,
    from: i16,
    to: i16,
}

const fn f(ty: Ty) -> Field {
    Field {
        ty,
        from: 0,
        to: i16::MAX,
    }
}

const fn v(ty: Ty, from: i16, to: i16) -> Field {
    Field { ty, from, to }
}

/// A request's shape: its fields and the first flexible version (compact encodings, tags).
#[derive(Debug)]
pub(crate) struct Shape {
    pub(crate) flexible_from: i16,
    pub(crate) fields: &'static [Field],
}

use Ty::*;

const MAX: i16 = i16::MAX;

pub(crate) const API_VERSIONS: Shape = Shape {
    flexible_from: 3,
    fields: &[v(Str, 3, MAX), v(Str, 3, MAX)],
};

pub(crate) const DESCRIBE_CLUSTER: Shape = Shape {
    flexible_from: 0,
    fields: &[f(I8), v(I8, 1, MAX), v(I8, 2, MAX)],
};

pub(crate) const PRODUCE: Shape = Shape {
    flexible_from: 9,
    fields: &[
        f(Str), // transactional_id
        f(I16), // acks
        f(I32), // timeout_ms
        f(Structs(&[
            v(Str, 0, 12),                   // name
            v(Uuid, 13, MAX),                // topic_id
            f(Structs(&[f(I32), f(Bytes)])), // index, records
        ])),
    ],
};

pub(crate) const FETCH: Shape = Shape {
    flexible_from: 12,
    fields: &[
        v(I32, 0, 14),  // replica_id
        f(I32),         // max_wait_ms
        f(I32),         // min_bytes
        f(I32),         // max_bytes
        f(I8),          // isolation_level
        v(I32, 7, MAX), // session_id
        v(I32, 7, MAX), // session_epoch
        f(Structs(&[
            v(Str, 0, 12),
            v(Uuid, 13, MAX),
            f(Structs(&[
                f(I32),          // partition
                v(I32, 9, MAX),  // current_leader_epoch
                f(I64),          // fetch_offset
                v(I32, 12, MAX), // last_fetched_epoch
                v(I64, 5, MAX),  // log_start_offset
                f(I32),          // partition_max_bytes
            ])),
        ])),
        v(
            Structs(&[v(Str, 7, 12), v(Uuid, 13, MAX), v(Ints, 7, MAX)]),
            7,
            MAX,
        ), // forgotten
        v(Str, 11, MAX), // rack_id
    ],
};

pub(crate) const LIST_OFFSETS: Shape = Shape {
    flexible_from: 6,
    fields: &[
        f(I32),        // replica_id
        v(I8, 2, MAX), // isolation_level
        f(Structs(&[
            f(Str),
            f(Structs(&[f(I32), v(I32, 4, MAX), f(I64)])),
        ])),
        v(I32, 10, MAX), // timeout_ms
    ],
};

pub(crate) const METADATA: Shape = Shape {
    flexible_from: 9,
    fields: &[
        f(Structs(&[v(Uuid, 10, MAX), f(Str)])),
        v(I8, 4, MAX), // allow_auto_topic_creation
        v(I8, 8, 10),  // include_cluster_authorized_operations
        v(I8, 8, MAX), // include_topic_authorized_operations
    ],
};

pub(crate) const FIND_COORDINATOR: Shape = Shape {
    flexible_from: 3,
    fields: &[v(Str, 0, 3), v(I8, 1, MAX), v(Strs, 4, MAX)],
};

pub(crate) const CREATE_TOPICS: Shape = Shape {
    flexible_from: 5,
    fields: &[
        f(Structs(&[
            f(Str),                         // name
            f(I32),                         // num_partitions
            f(I16),                         // replication_factor
            f(Structs(&[f(I32), f(Ints)])), // assignments
            f(Structs(&[f(Str), f(Str)])),  // configs
        ])),
        f(I32), // timeout_ms
        f(I8),  // validate_only
    ],
};

pub(crate) const DELETE_TOPICS: Shape = Shape {
    flexible_from: 4,
    fields: &[
        v(Structs(&[f(Str), f(Uuid)]), 6, MAX),
        v(Strs, 0, 5),
        f(I32),
    ],
};

pub(crate) const DELETE_RECORDS: Shape = Shape {
    flexible_from: 2,
    fields: &[
        f(Structs(&[f(Str), f(Structs(&[f(I32), f(I64)]))])), // topics: name, partitions
        f(I32),                                               // timeout_ms
    ],
};

pub(crate) const CREATE_PARTITIONS: Shape = Shape {
    flexible_from: 2,
    fields: &[
        f(Structs(&[f(Str), f(I32), f(Structs(&[f(Ints)]))])),
        f(I32),
        f(I8),
    ],
};

pub(crate) const DESCRIBE_CONFIGS: Shape = Shape {
    flexible_from: 4,
    fields: &[
        f(Structs(&[f(I8), f(Str), f(Strs)])),
        f(I8),         // include_synonyms
        v(I8, 3, MAX), // include_documentation
    ],
};

pub(crate) const INCREMENTAL_ALTER_CONFIGS: Shape = Shape {
    flexible_from: 1,
    fields: &[
        f(Structs(&[
            f(I8),
            f(Str),
            f(Structs(&[f(Str), f(I8), f(Str)])),
        ])),
        f(I8),
    ],
};

pub(crate) const ALTER_CONFIGS: Shape = Shape {
    flexible_from: 2,
    fields: &[
        f(Structs(&[f(I8), f(Str), f(Structs(&[f(Str), f(Str)]))])),
        f(I8),
    ],
};

pub(crate) const JOIN_GROUP: Shape = Shape {
    flexible_from: 6,
    fields: &[
        f(Str),                          // group_id
        f(I32),                          // session_timeout_ms
        v(I32, 1, MAX),                  // rebalance_timeout_ms
        f(Str),                          // member_id
        v(Str, 5, MAX),                  // group_instance_id
        f(Str),                          // protocol_type
        f(Structs(&[f(Str), f(Bytes)])), // protocols: name, metadata
        v(Str, 8, MAX),                  // reason
    ],
};

pub(crate) const SYNC_GROUP: Shape = Shape {
    flexible_from: 4,
    fields: &[
        f(Str),                          // group_id
        f(I32),                          // generation_id
        f(Str),                          // member_id
        v(Str, 3, MAX),                  // group_instance_id
        v(Str, 5, MAX),                  // protocol_type
        v(Str, 5, MAX),                  // protocol_name
        f(Structs(&[f(Str), f(Bytes)])), // assignments: member_id, assignment
    ],
};

pub(crate) const HEARTBEAT: Shape = Shape {
    flexible_from: 4,
    fields: &[f(Str), f(I32), f(Str), v(Str, 3, MAX)],
};

pub(crate) const CONSUMER_GROUP_HEARTBEAT: Shape = Shape {
    flexible_from: 0,
    fields: &[
        f(Str),                          // group_id
        f(Str),                          // member_id
        f(I32),                          // member_epoch
        f(Str),                          // instance_id
        f(Str),                          // rack_id
        f(I32),                          // rebalance_timeout_ms
        f(Strs),                         // subscribed_topic_names (nullable)
        v(Str, 1, MAX),                  // subscribed_topic_regex
        f(Str),                          // server_assignor
        f(Structs(&[f(Uuid), f(Ints)])), // topic_partitions (nullable): id, partitions
    ],
};

pub(crate) const CONSUMER_GROUP_DESCRIBE: Shape = Shape {
    flexible_from: 0,
    fields: &[f(Strs), f(I8)], // group_ids, include_authorized_operations
};

pub(crate) const LEAVE_GROUP: Shape = Shape {
    flexible_from: 4,
    fields: &[
        f(Str),                                                // group_id
        v(Str, 0, 2),                                          // member_id
        v(Structs(&[f(Str), f(Str), v(Str, 5, MAX)]), 3, MAX), // members: id, instance, reason
    ],
};

pub(crate) const OFFSET_COMMIT: Shape = Shape {
    flexible_from: 8,
    fields: &[
        f(Str),         // group_id
        f(I32),         // generation_id_or_member_epoch
        f(Str),         // member_id
        v(Str, 7, MAX), // group_instance_id
        v(I64, 2, 4),   // retention_time_ms
        f(Structs(&[
            f(Str),                                                // name
            f(Structs(&[f(I32), f(I64), v(I32, 6, MAX), f(Str)])), // index, offset, epoch, metadata
        ])),
    ],
};

pub(crate) const OFFSET_FETCH: Shape = Shape {
    flexible_from: 6,
    fields: &[
        v(Str, 0, 7),                         // group_id
        v(Structs(&[f(Str), f(Ints)]), 0, 7), // topics: name, partitions (null: all)
        v(
            Structs(&[
                f(Str),                         // group_id
                v(Str, 9, MAX),                 // member_id
                v(I32, 9, MAX),                 // member_epoch
                f(Structs(&[f(Str), f(Ints)])), // topics
            ]),
            8,
            MAX,
        ),
        v(I8, 7, MAX), // require_stable
    ],
};

pub(crate) const LIST_GROUPS: Shape = Shape {
    flexible_from: 3,
    fields: &[v(Strs, 4, MAX), v(Strs, 5, MAX)],
};

pub(crate) const DESCRIBE_GROUPS: Shape = Shape {
    flexible_from: 5,
    fields: &[f(Strs), v(I8, 3, MAX)],
};

pub(crate) const DELETE_GROUPS: Shape = Shape {
    flexible_from: 2,
    fields: &[f(Strs)],
};

/// OffsetDelete has no flexible version.
pub(crate) const OFFSET_DELETE: Shape = Shape {
    flexible_from: MAX,
    fields: &[f(Str), f(Structs(&[f(Str), f(Structs(&[f(I32)]))]))],
};

pub(crate) const INIT_PRODUCER_ID: Shape = Shape {
    flexible_from: 2,
    fields: &[
        f(Str),         // transactional_id
        f(I32),         // transaction_timeout_ms
        v(I64, 3, MAX), // producer_id
        v(I16, 3, MAX), // producer_epoch
    ],
};

/// A topic and partition indexes of AddPartitionsToTxn.
const TXN_TOPIC: Ty = Structs(&[f(Str), f(Ints)]);

pub(crate) const ADD_PARTITIONS_TO_TXN: Shape = Shape {
    flexible_from: 3,
    fields: &[
        // transactions: id, producer id, epoch, verify_only, topics (broker-to-broker)
        v(
            Structs(&[f(Str), f(I64), f(I16), f(I8), f(TXN_TOPIC)]),
            4,
            MAX,
        ),
        v(Str, 0, 3),       // transactional_id
        v(I64, 0, 3),       // producer_id
        v(I16, 0, 3),       // producer_epoch
        v(TXN_TOPIC, 0, 3), // topics
    ],
};

pub(crate) const ADD_OFFSETS_TO_TXN: Shape = Shape {
    flexible_from: 3,
    fields: &[f(Str), f(I64), f(I16), f(Str)], // transactional id, producer id, epoch, group
};

pub(crate) const END_TXN: Shape = Shape {
    flexible_from: 3,
    fields: &[f(Str), f(I64), f(I16), f(I8)], // transactional id, producer id, epoch, committed
};

pub(crate) const TXN_OFFSET_COMMIT: Shape = Shape {
    flexible_from: 3,
    fields: &[
        f(Str),         // transactional_id
        f(Str),         // group_id
        f(I64),         // producer_id
        f(I16),         // producer_epoch
        v(I32, 3, MAX), // generation_id
        v(Str, 3, MAX), // member_id
        v(Str, 3, MAX), // group_instance_id
        f(Structs(&[
            f(Str),                                                // name
            f(Structs(&[f(I32), f(I64), v(I32, 2, MAX), f(Str)])), // index, offset, epoch, metadata
        ])),
    ],
};

pub(crate) const DESCRIBE_TRANSACTIONS: Shape = Shape {
    flexible_from: 0,
    fields: &[f(Strs)],
};

pub(crate) const LIST_TRANSACTIONS: Shape = Shape {
    flexible_from: 0,
    fields: &[
        f(Strs),        // state_filters
        f(Longs),       // producer_id_filters
        v(I64, 1, MAX), // duration_filter
        v(Str, 2, MAX), // transactional_id_pattern
    ],
};

pub(crate) const DESCRIBE_PRODUCERS: Shape = Shape {
    flexible_from: 0,
    fields: &[f(Structs(&[f(Str), f(Ints)]))], // topics: name, partition_indexes
};

pub(crate) const WRITE_TXN_MARKERS: Shape = Shape {
    flexible_from: 1,
    fields: &[f(Structs(&[
        f(I64),                         // producer_id
        f(I16),                         // producer_epoch
        f(I8),                          // transaction_result
        f(Structs(&[f(Str), f(Ints)])), // topics: name, partition_indexes
        f(I32),                         // coordinator_epoch
    ]))],
};

pub(crate) const DESCRIBE_LOG_DIRS: Shape = Shape {
    flexible_from: 2,
    fields: &[f(Structs(&[f(Str), f(Ints)]))], // topics (nullable): topic, partitions
};

/// An ACL filter (DescribeAcls, a DeleteAcls filter) and an ACL creation have the same fields:
/// resource type, name, pattern type, principal, host, operation, permission type.
const ACL_FIELDS: &[Field] = &[f(I8), f(Str), f(I8), f(Str), f(Str), f(I8), f(I8)];

pub(crate) const DESCRIBE_ACLS: Shape = Shape {
    flexible_from: 2,
    fields: ACL_FIELDS,
};

pub(crate) const CREATE_ACLS: Shape = Shape {
    flexible_from: 2,
    fields: &[f(Structs(ACL_FIELDS))],
};

pub(crate) const DELETE_ACLS: Shape = Shape {
    flexible_from: 2,
    fields: &[f(Structs(ACL_FIELDS))],
};

pub(crate) const SASL_HANDSHAKE: Shape = Shape {
    flexible_from: MAX,
    fields: &[f(Str)], // mechanism
};

pub(crate) const SASL_AUTHENTICATE: Shape = Shape {
    flexible_from: 2,
    fields: &[f(Bytes)], // auth_bytes
};

pub(crate) const DESCRIBE_USER_SCRAM_CREDENTIALS: Shape = Shape {
    flexible_from: 0,
    fields: &[f(Structs(&[f(Str)]))], // users (nullable): name
};

pub(crate) const ALTER_USER_SCRAM_CREDENTIALS: Shape = Shape {
    flexible_from: 0,
    fields: &[
        f(Structs(&[f(Str), f(I8)])), // deletions: name, mechanism
        f(Structs(&[
            f(Str),   // name
            f(I8),    // mechanism
            f(I32),   // iterations
            f(Bytes), // salt
            f(Bytes), // salted_password
        ])), // upsertions
    ],
};

/// Where and why a request does not fit its shape.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("malformed request body at byte {at}: {what}")]
pub(crate) struct Malformed {
    at: usize,
    what: &'static str,
}

struct Walker<'a> {
    buf: &'a [u8],
    at: usize,
    version: i16,
    flexible: bool,
}

impl Walker<'_> {
    fn fail(&self, what: &'static str) -> Malformed {
        Malformed { at: self.at, what }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        if n > self.remaining() {
            return Err(self.fail("field runs past the end"));
        }
        self.at += n;
        Ok(())
    }

    fn int(&mut self, n: usize) -> Result<i64, Malformed> {
        if n > self.remaining() {
            return Err(self.fail("field runs past the end"));
        }
        let value = self.buf[self.at..self.at + n]
            .iter()
            .fold(0i64, |acc, b| (acc << 8) | i64::from(*b));
        self.at += n;
        // Sign-extend.
        let shift = 64 - 8 * n as u32;
        Ok((value << shift) >> shift)
    }

    fn uvarint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for i in 0..5 {
            let b = *self
                .buf
                .get(self.at)
                .ok_or_else(|| self.fail("varint runs past the end"))?;
            self.at += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail("varint too long"))
    }

    /// A length-prefixed field (string or bytes): skips it.
    fn sized(&mut self, classic_width: usize) -> Result<(), Malformed> {
        let len = if self.flexible {
            self.uvarint()? as i64 - 1
        } else {
            self.int(classic_width)?
        };
        if len < -1 {
            return Err(self.fail("negative length"));
        }
        self.skip(len.max(0) as usize)
    }

    /// An array's element count, which must not exceed the bytes left (each element takes at
    /// least `min_element` bytes).
    fn count(&mut self, min_element: usize) -> Result<usize, Malformed> {
        let n = if self.flexible {
            self.uvarint()? as i64 - 1
        } else {
            self.int(4)?
        };
        if n < -1 {
            return Err(self.fail("negative array length"));
        }
        let n = n.max(0) as usize;
        if n.saturating_mul(min_element) > self.remaining() {
            return Err(self.fail("array longer than the request"));
        }
        Ok(n)
    }

    fn tags(&mut self) -> Result<(), Malformed> {
        if !self.flexible {
            return Ok(());
        }
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.skip(size)?;
        }
        Ok(())
    }

    fn walk(&mut self, fields: &[Field]) -> Result<(), Malformed> {
        let version = self.version;
        for field in fields.iter().filter(|f| (f.from..=f.to).contains(&version)) {
            match field.ty {
                I8 => self.skip(1)?,
                I16 => self.skip(2)?,
                I32 => self.skip(4)?,
                I64 => self.skip(8)?,
                Uuid => self.skip(16)?,
                Str => self.sized(2)?,
                Bytes => self.sized(4)?,
                Ints => {
                    let n = self.count(4)?;
                    self.skip(n * 4)?;
                }
                Longs => {
                    let n = self.count(8)?;
                    self.skip(n * 8)?;
                }
                Strs => {
                    for _ in 0..self.count(1)? {
                        self.sized(2)?;
                    }
                }
                Structs(inner) => {
                    for _ in 0..self.count(1)? {
                        self.walk(inner)?;
                    }
                }
            }
        }
        self.tags()
    }
}

impl Shape {
    /// Checks that `body` (the request after its header) fits this shape in `version`.
    pub(crate) fn check(&self, body: &[u8], version: i16) -> Result<(), Malformed> {
        let mut walker = Walker {
            buf: body,
            at: 0,
            version,
            flexible: version >= self.flexible_from,
        };
        walker.walk(self.fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ROUTES;
    use crate::api::samples::sample;

    #[test]
    fn every_served_request_version_fits_its_shape_exactly() {
        for route in ROUTES {
            for version in route.versions.min..=route.versions.max {
                let body = sample(route.key, version);
                let shape = route.shape;
                let mut walker = Walker {
                    buf: &body,
                    at: 0,
                    version,
                    flexible: version >= shape.flexible_from,
                };
                walker
                    .walk(shape.fields)
                    .unwrap_or_else(|e| panic!("{:?} v{version}: {e}", route.key));
                assert_eq!(
                    walker.at,
                    body.len(),
                    "{:?} v{version}: walked all bytes",
                    route.key
                );
            }
        }
    }

    #[test]
    fn an_array_longer_than_the_request_is_refused_before_decoding() {
        // Metadata v1: topics array claiming 2^31-1 entries.
        let body = [0x7f, 0xff, 0xff, 0xff, 0, 0];
        assert!(METADATA.check(&body, 1).is_err());
        // null topics, then nothing else at v1.
        assert_eq!(METADATA.check(&[0xff, 0xff, 0xff, 0xff], 1), Ok(()));
        // One topic "a" at v1.
        assert_eq!(METADATA.check(&[0, 0, 0, 1, 0, 1, b'a'], 1), Ok(()));
        assert!(METADATA.check(&[0, 0, 0, 1, 0, 2, b'a'], 1).is_err());
    }
}
