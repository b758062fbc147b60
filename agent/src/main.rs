/// jemalloc for every allocation of the process, librdkafka's, SQLite's and OpenSSL's too (the
/// `unprefixed_malloc_on_supported_platforms` feature), with one arena (.cargo/config.toml):
/// librdkafka allocates each record on one thread and frees it on another, which glibc's
/// malloc pays for in locks and consolidation; see BENCHMARKS.md, issue 27, fourteenth part.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    ferry_agent::main_with(ferry_agent::builtin_registry())
}
