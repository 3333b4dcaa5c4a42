//! The cron jobs as their store keeps them: read and parsed into the service's state (a record
//! that cannot be read is an error naming where it is, never overwritten), and the store's guard.

use clawcage_core::records::{RecordStore, StoredRecord};

use super::{CronError, Job, JobsFile, State};

/// The jobs `store` keeps (none when it keeps nothing). A record that cannot be read or parsed
/// is an error naming where it is; it is never overwritten.
pub(super) fn load_jobs(store: &dyn RecordStore) -> Result<State, CronError> {
    match store.read(None) {
        Ok(StoredRecord::Found { bytes, version }) => {
            parse_jobs(&bytes, Some(version), &store.describe())
        }
        Ok(StoredRecord::Unchanged | StoredRecord::Missing) => Ok(State {
            next_id: 0,
            jobs: Vec::new(),
            version: None,
        }),
        Err(reason) => Err(CronError::Store {
            place: store.describe(),
            reason,
        }),
    }
}

/// The store's guard (a file lock), or none, with a warning, when it cannot be taken: this
/// process's own mutex still orders its own changes.
pub(super) fn guard_of(store: &dyn RecordStore) -> Option<Box<dyn Send>> {
    store.hold().unwrap_or_else(|error| {
        tracing::warn!(%error, "cannot lock the cron jobs");
        None
    })
}

/// The jobs of a stored record at `version`; `place` names it in errors.
pub(super) fn parse_jobs(
    bytes: &[u8],
    version: Option<String>,
    place: &str,
) -> Result<State, CronError> {
    let loaded = serde_json::from_slice::<JobsFile>(bytes).map_err(|error| CronError::Corrupt {
        place: place.to_string(),
        reason: error.to_string(),
    })?;
    let mut jobs = Vec::with_capacity(loaded.jobs.len());
    for stored in loaded.jobs {
        let compiled = stored
            .schedule
            .compile()
            .map_err(|reason| CronError::Corrupt {
                place: place.to_string(),
                reason: format!("job {}: {reason}", stored.id),
            })?;
        jobs.push(Job { stored, compiled });
    }
    Ok(State {
        next_id: loaded.next_id,
        jobs,
        version,
    })
}
