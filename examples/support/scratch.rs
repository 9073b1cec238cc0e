//! A scratch database for the load tools: created on the server of `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), migrated, and dropped `WITH (FORCE)` by
//! [`Scratch::drop_db`], or on drop if a tool failed or panicked first.
#![allow(dead_code)]

use anyhow::{Context, Result};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The server the tools run against.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub struct Scratch {
    server: String,
    url: String,
    name: String,
    dropped: bool,
}

impl Scratch {
    /// Creates `ordo_load_<random>` and runs ordo's migrations in it.
    pub async fn create(server: &str) -> Result<Self> {
        let name = format!("ordo_load_{}", uuid::Uuid::new_v4().simple());
        let admin = PgPool::connect(server)
            .await
            .context("connect to DATABASE_URL (a role that may CREATE DATABASE)")?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await?;
        admin.close().await;
        let scratch = Self {
            url: with_database(server, &name),
            server: server.to_owned(),
            name,
            dropped: false,
        };
        let pool = scratch.pool(2).await?;
        ordo::migrate(&pool).await?;
        pool.close().await;
        Ok(scratch)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub async fn pool(&self, size: u32) -> Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(size)
            .connect(&self.url)
            .await?)
    }

    pub async fn drop_db(mut self) -> Result<()> {
        self.dropped = true;
        drop_database(&self.server, &self.name).await
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Reached when a tool failed or panicked: drop the database from a thread of its own.
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = runtime.block_on(drop_database(&server, &name));
            }
        })
        .join();
    }
}

async fn drop_database(server: &str, name: &str) -> Result<()> {
    let admin = PgPool::connect(server).await?;
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(())
}

/// `url` with its database name replaced by `name` (a query string is kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{host}/{name}?{query}"),
        None => format!("{host}/{name}"),
    }
}
