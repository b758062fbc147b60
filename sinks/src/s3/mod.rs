//! `s3`: events into objects of S3 and S3-compatible stores (MinIO, Ceph RGW, SeaweedFS,
//! Cloudflare R2, GCS's XML API), exactly once.
//!
//! Events are written to local staging files by the rolling writer ([`crate::roll`]): a batch
//! is acknowledged once it is on the local disk and recorded in the agent's state store.
//! When a file rolls, its object key is fixed and recorded; an uploader task sends finished
//! files up one at a time, a large one as a multipart upload of `part_size` parts
//! (`parts_in_flight` at once), and deletes the staging file after the store confirmed the
//! object. An object becomes visible only whole (a single PUT, or a completed multipart
//! upload), and an upload repeated after a crash writes the same bytes under the same key.
//!
//! # Keys
//!
//! `<path>/<file_prefix><sink>.<first>-<last><file_suffix>`: `path` and `file_prefix` with
//! Flume's escapes rendered per event, `<first>` and `<last>` the smallest and largest channel
//! sequence numbers the object holds (20 digits). With a channel that does not number its
//! events (`memory`), `<opened ms>-<staging id>` instead.
//!
//! # When the store fails
//!
//! The uploader retries with a backoff (1 s doubling to 30 s) for as long as it takes; the
//! component is marked unreachable with the error (the store's own code, the bucket and the
//! key). While uploads fail the sink takes no new events: they wait in the channel, and
//! `/health` reports the sink. A multipart upload the sink started and could not complete is
//! aborted (at once, or at the next start when the agent stopped first; one whose id a crash
//! kept from the progress record is found at the next start by listing the bucket's multipart
//! uploads, see `sweep`).

mod config;
mod credentials;
mod sweep;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{
    ComponentConfig, ComponentMetrics, ConfigError, Counter, Latency, Pipelining, Sink, SinkBatch,
    SinkContext, SinkError, async_trait,
};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStoreExt, RetryConfig};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::roll::{
    Compression, FinishedRecord, Format, RollOptions, RollSettings, Roller, SharedProgress,
    Staging, blocking,
};
pub use config::S3Config;

/// S3's smallest part (all but the last).
const MIN_PART_SIZE: u64 = 5 << 20;
/// S3's largest part.
const MAX_PART_SIZE: u64 = 5 << 30;
/// How long `stop` waits for finished files to go up before leaving them for the next start.
const STOP_UPLOAD_WAIT: Duration = Duration::from_secs(30);

/// The `s3` sink.
#[derive(Debug)]
pub struct S3Sink {
    config: S3Config,
    settings: Option<RollSettings>,
    roller: Option<Roller>,
    uploader: Option<Arc<Uploader>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl S3Sink {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: S3Config = cfg.parse()?;
        if config.bucket.trim().is_empty() {
            return Err(cfg.error_at("bucket", "`bucket` must not be empty"));
        }
        if config.bucket.contains('/') {
            return Err(cfg.error_at(
                "bucket",
                "`bucket` is the bucket's name alone; write the rest of the key in `path`",
            ));
        }
        let part = config.part_size.bytes();
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&part) {
            return Err(cfg.error_at(
                "part_size",
                "`part_size` must be between 5MiB and 5GiB (S3's part sizes)",
            ));
        }
        if config.parts_in_flight == 0 {
            return Err(cfg.error_at("parts_in_flight", "`parts_in_flight` must be above 0"));
        }
        if let Some(endpoint) = &config.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(cfg.error_at(
                "endpoint",
                format!(
                    "`endpoint` `{endpoint}` must be a URL: `http://host:port` or `https://host`"
                ),
            ));
        }
        match (&config.access_key_id, &config.secret_access_key) {
            (Some(_), None) => {
                return Err(cfg.error_at(
                    "access_key_id",
                    "`access_key_id` needs `secret_access_key` too",
                ));
            }
            (None, Some(_)) => {
                return Err(cfg.error_at(
                    "secret_access_key",
                    "`secret_access_key` needs `access_key_id` too",
                ));
            }
            _ => {}
        }
        if config.session_token.is_some() && config.access_key_id.is_none() {
            return Err(cfg.error_at(
                "session_token",
                "`session_token` goes with `access_key_id` and `secret_access_key`",
            ));
        }
        let settings = RollSettings::new(
            cfg,
            RollOptions {
                path: ("path", &config.path),
                file_prefix: ("file_prefix", &config.file_prefix),
                file_suffix: ("file_suffix", config.file_suffix.as_deref()),
                format: config.format,
                compression: config.compression,
                append_newline: config.append_newline,
                roll_size: config.roll_size.bytes(),
                roll_count: config.roll_count,
                roll_interval: config.roll_interval,
                idle_timeout: config.idle_timeout,
                max_open_files: config.max_open_files,
                use_local_time: config.use_local_time,
                round: config.round,
                time_zone: config.time_zone.as_deref(),
            },
        )?;
        Ok(Self {
            config,
            settings: Some(settings),
            roller: None,
            uploader: None,
            task: None,
        })
    }

    /// The store client, with credentials from the configuration or the standard places.
    fn store(&self) -> Result<AmazonS3, SinkError> {
        let config = &self.config;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_virtual_hosted_style_request(!config.force_path_style)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(config.request_timeout)
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_allow_http(
                        config
                            .endpoint
                            .clone()
                            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                            .or_else(|| std::env::var("AWS_ENDPOINT").ok())
                            .is_some_and(|e| e.starts_with("http://"))
                            || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true"),
                    ),
            )
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: config.request_timeout,
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = config
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
        {
            builder = builder.with_region(region);
        }
        let from_env = std::env::var_os("AWS_ACCESS_KEY_ID").is_some();
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
            if let Some(token) = &config.session_token {
                builder = builder.with_token(token);
            }
        } else if !from_env || config.profile.is_some() {
            // Without keys here, object_store asks the instance's or container's role.
            if let Some(found) = credentials::from_profile(config.profile.as_deref())? {
                builder = builder
                    .with_access_key_id(found.access_key_id)
                    .with_secret_access_key(found.secret_access_key);
                if let Some(token) = found.session_token {
                    builder = builder.with_token(token);
                }
            }
        }
        ferry_core::install_tls_provider();
        builder.build().map_err(|e| {
            SinkError::Delivery(format!(
                "configuring the client of bucket `{}`: {e}",
                config.bucket
            ))
        })
    }
}

#[async_trait]
impl Sink for S3Sink {
    async fn start(&mut self, ctx: &SinkContext) -> Result<(), SinkError> {
        let Some(state) = ctx.state.clone() else {
            return Err(SinkError::Delivery(
                "the s3 sink keeps its progress in the agent's state store, and there is none"
                    .into(),
            ));
        };
        let staging = Staging::private(match &self.config.staging_directory {
            Some(dir) => dir.clone(),
            None => state
                .path()
                .parent()
                .map(|dir| dir.join("staging").join(&ctx.name))
                .unwrap_or_else(|| PathBuf::from("staging").join(&ctx.name)),
        });
        let store = Arc::new(self.store()?);
        let Some(settings) = self.settings.take() else {
            return Err(SinkError::Delivery("the s3 sink was started twice".into()));
        };
        let name = ctx.name.clone();
        let keys = sweep::SinkKeys::new(
            &settings.path,
            &settings.file_prefix,
            &settings.file_suffix,
            &name,
        );
        let (roller, progress) = blocking({
            let staging = staging.clone();
            move || {
                let progress = Arc::new(SharedProgress::load(state, &name)?);
                let roller = Roller::recover(settings, &name, staging, Arc::clone(&progress))?;
                Ok((roller, progress))
            }
        })
        .await?;
        let pending = progress.get().finished.len();
        if pending > 0 {
            tracing::info!(
                sink = ctx.name,
                objects = pending,
                "uploading objects an earlier run finished"
            );
        }
        let uploader = Arc::new(Uploader {
            sink: ctx.name.clone(),
            bucket: self.config.bucket.clone(),
            store,
            staging,
            progress,
            format: self.config.format,
            compression: self.config.compression,
            part_size: self.config.part_size.bytes() as usize,
            parts_in_flight: self.config.parts_in_flight,
            metrics: ctx.metrics.clone(),
            objects: ctx.metrics.counter("ObjectWrittenCount"),
            bytes: ctx.metrics.counter("ObjectWrittenBytes"),
            parts: ctx.metrics.counter("PartsInFlight"),
            staged: ctx.metrics.counter("ObjectsWaitingCount"),
            staged_bytes: ctx.metrics.counter("ObjectsWaitingBytes"),
            latency: ctx.metrics.latency("UploadLatency"),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        uploader.count_waiting();
        let timeout = self.config.request_timeout;
        self.task = Some(tokio::spawn({
            let uploader = Arc::clone(&uploader);
            async move {
                // Before the uploader, which records the multipart uploads it starts.
                sweep::abort_abandoned(&uploader, &keys, timeout).await;
                uploader.run().await;
            }
        }));
        self.uploader = Some(uploader);
        self.roller = Some(roller);
        Ok(())
    }

    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.send(batch).await?;
        self.flush().await
    }

    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let (Some(roller), Some(uploader)) = (&mut self.roller, &self.uploader) else {
            return Err(SinkError::Delivery("the s3 sink is not started".into()));
        };
        if batch.events.is_empty() {
            return Ok(());
        }
        // While objects cannot go up, events wait in the channel rather than on this disk.
        if let Some(error) = uploader.error() {
            return Err(SinkError::Delivery(error));
        }
        let waiting = uploader.staged_bytes.get();
        let limit = self.config.max_staged.bytes();
        if waiting >= limit {
            return Err(SinkError::Delivery(format!(
                "{waiting} bytes of finished objects wait for upload to bucket `{}` (max_staged {}); new events wait in the channel",
                self.config.bucket, self.config.max_staged
            )));
        }
        let result = roller.send(batch.events, batch.sequences).await;
        // A roll on the way may have finished objects.
        uploader.count_waiting();
        uploader.wake.notify_one();
        result
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        let (Some(roller), Some(uploader)) = (&mut self.roller, &self.uploader) else {
            return Ok(());
        };
        let result = roller.flush().await;
        uploader.count_waiting();
        uploader.wake.notify_one();
        result
    }

    fn pipelining(&self) -> Pipelining {
        crate::roll::PIPELINING
    }

    async fn idle(&mut self) -> Result<(), SinkError> {
        let (Some(roller), Some(uploader)) = (&mut self.roller, &self.uploader) else {
            return Ok(());
        };
        if roller.roll_due().await? > 0 {
            uploader.count_waiting();
            uploader.wake.notify_one();
        }
        Ok(())
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        let (Some(roller), Some(uploader)) = (&mut self.roller, &self.uploader) else {
            return Ok(());
        };
        let rolled = roller.roll_all().await;
        uploader.count_waiting();
        uploader.wake.notify_one();
        let deadline = Instant::now() + STOP_UPLOAD_WAIT;
        while !uploader.progress.get().finished.is_empty() && Instant::now() < deadline {
            if uploader.error().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = uploader.progress.get().finished.len();
        if left > 0 {
            tracing::warn!(
                sink = uploader.sink,
                objects = left,
                "stopping with objects not yet uploaded: they are kept in the staging directory and go up at the next start"
            );
        }
        uploader.stopping.store(true, Ordering::Relaxed);
        uploader.wake.notify_one();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        rolled.map(|_| ())
    }
}

/// Sends finished files up, oldest first.
#[derive(Debug)]
struct Uploader {
    sink: String,
    bucket: String,
    store: Arc<AmazonS3>,
    staging: Staging,
    progress: Arc<SharedProgress>,
    format: Format,
    compression: Compression,
    part_size: usize,
    parts_in_flight: usize,
    metrics: ComponentMetrics,
    objects: Counter,
    bytes: Counter,
    parts: Counter,
    staged: Counter,
    staged_bytes: Counter,
    latency: Latency,
    wake: Notify,
    stopping: AtomicBool,
    /// The last upload's failure, until an upload succeeds.
    error: Mutex<Option<String>>,
}

impl Uploader {
    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_error(&self, error: Option<String>) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = error;
    }

    /// Updates the gauges of finished files waiting for upload.
    fn count_waiting(&self) {
        let progress = self.progress.get();
        self.staged.set(progress.finished.len() as u64);
        self.staged_bytes
            .set(progress.finished.iter().map(|f| f.length).sum());
    }

    async fn run(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            let next = self.progress.get().finished.first().cloned();
            let Some(record) = next else {
                self.wake.notified().await;
                continue;
            };
            match self.upload(&record).await {
                Ok(()) => {
                    backoff = Duration::from_secs(1);
                    if self.error().is_some() {
                        tracing::info!(sink = self.sink, bucket = self.bucket, "uploads resumed");
                    }
                    self.set_error(None);
                    self.metrics.reachable();
                }
                Err(error) => {
                    // One line: a store's answer may be XML over several.
                    let message = error
                        .to_string()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ");
                    tracing::warn!(sink = self.sink, error = %message, retry_in = ?backoff, "upload failed");
                    self.metrics.unreachable(&message);
                    self.set_error(Some(message));
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.wake.notified() => {
                            // A new file or a stop: the backoff still applies to this one.
                            tokio::time::sleep(backoff).await;
                        }
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            self.count_waiting();
        }
    }

    /// Uploads one finished file and forgets it.
    async fn upload(&self, record: &FinishedRecord) -> Result<(), SinkError> {
        let started = Instant::now();
        // The key is already a store path (see `Roller::key`): parsed, not encoded again.
        let key = ObjectPath::parse(&record.key)
            .unwrap_or_else(|_| ObjectPath::from(record.key.as_str()));
        let context = |what: &str, e: &dyn std::fmt::Display| {
            SinkError::Delivery(format!(
                "sink `{}`: {what} s3://{}/{}: {e}",
                self.sink, self.bucket, record.key
            ))
        };
        if let Some(id) = &record.upload_id {
            self.abort(&key, id).await;
            self.record_upload_id(record.id, None).await?;
        }
        let (staging, format, compression) = (self.staging.clone(), self.format, self.compression);
        let file_record = record.clone();
        let path =
            blocking(move || staging.finished_file(&file_record, format, compression)).await?;
        let size = tokio::fs::metadata(&path)
            .await
            .map_err(|e| SinkError::io(format!("reading {}", path.display()), e))?
            .len();
        if size <= self.part_size as u64 {
            let data = tokio::fs::read(&path)
                .await
                .map_err(|e| SinkError::io(format!("reading {}", path.display()), e))?;
            self.store
                .put(&key, Bytes::from(data).into())
                .await
                .map_err(|e| context("writing", &e))?;
        } else {
            let id = self
                .store
                .create_multipart(&key)
                .await
                .map_err(|e| context("starting a multipart upload of", &e))?;
            self.record_upload_id(record.id, Some(id.clone())).await?;
            match self.put_parts(&key, &id, &path, size).await {
                Ok(parts) => {
                    if let Err(e) = self.store.complete_multipart(&key, &id, parts).await {
                        self.abort(&key, &id).await;
                        self.record_upload_id(record.id, None).await?;
                        return Err(context("completing the multipart upload of", &e));
                    }
                }
                Err(error) => {
                    self.abort(&key, &id).await;
                    self.record_upload_id(record.id, None).await?;
                    return Err(context("uploading a part of", &error));
                }
            }
        }
        let progress = Arc::clone(&self.progress);
        let (id, staging) = (record.id, self.staging.clone());
        blocking(move || {
            progress.update(|p| p.finished.retain(|f| f.id != id))?;
            staging.remove(id);
            Ok(())
        })
        .await?;
        self.objects.inc();
        self.bytes.add(size);
        self.latency.observe(started.elapsed());
        tracing::debug!(
            sink = self.sink,
            key = record.key,
            size,
            "uploaded an object"
        );
        Ok(())
    }

    /// Uploads the parts of `path`, `parts_in_flight` at a time; their ids in order.
    async fn put_parts(
        &self,
        key: &ObjectPath,
        id: &str,
        path: &std::path::Path,
        size: u64,
    ) -> Result<Vec<PartId>, object_store::Error> {
        let count = size.div_ceil(self.part_size as u64) as usize;
        let mut parts: Vec<Option<PartId>> = vec![None; count];
        let mut running: JoinSet<(usize, Result<PartId, object_store::Error>)> = JoinSet::new();
        let mut next = 0;
        let mut failure = None;
        while next < count || !running.is_empty() {
            while failure.is_none() && next < count && running.len() < self.parts_in_flight {
                let data = match read_part(
                    path,
                    next as u64 * self.part_size as u64,
                    self.part_size,
                )
                .await
                {
                    Ok(data) => data,
                    Err(e) => {
                        failure = Some(object_store::Error::Generic {
                            store: "staging",
                            source: Box::new(e),
                        });
                        break;
                    }
                };
                let (store, key, id, index) =
                    (Arc::clone(&self.store), key.clone(), id.to_owned(), next);
                self.parts.inc();
                running.spawn(async move {
                    let result = store
                        .put_part(&key, &id, index, Bytes::from(data).into())
                        .await;
                    (index, result)
                });
                next += 1;
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            self.parts.sub(1);
            match joined {
                Ok((index, Ok(part))) => parts[index] = Some(part),
                Ok((_, Err(e))) => {
                    failure.get_or_insert(e);
                }
                Err(e) => {
                    failure.get_or_insert(object_store::Error::JoinError { source: e });
                }
            }
            if failure.is_some() {
                running.abort_all();
                while running.join_next().await.is_some() {
                    self.parts.sub(1);
                }
                break;
            }
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        Ok(parts.into_iter().flatten().collect())
    }

    async fn abort(&self, key: &ObjectPath, id: &str) {
        let id = id.to_owned();
        match self.store.abort_multipart(key, &id).await {
            Ok(()) => {
                tracing::info!(sink = self.sink, key = %key, "aborted an unfinished multipart upload")
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(sink = self.sink, key = %key, error = %e, "could not abort a multipart upload (a lifecycle rule for incomplete uploads removes it)")
            }
        }
    }

    async fn record_upload_id(&self, id: u64, upload: Option<String>) -> Result<(), SinkError> {
        let progress = Arc::clone(&self.progress);
        blocking(move || {
            progress.update(|p| {
                if let Some(f) = p.finished.iter_mut().find(|f| f.id == id) {
                    f.upload_id = upload;
                }
            })
        })
        .await
    }
}

/// Reads up to `len` bytes of `path` from `offset`.
async fn read_part(path: &std::path::Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut data = Vec::with_capacity(len);
    (&mut file).take(len as u64).read_to_end(&mut data).await?;
    Ok(data)
}
