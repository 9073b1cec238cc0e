//! A scratch database for the load tools: created on the server of `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), migrated, and dropped `WITH (FORCE)` by
//! [`Scratch::drop_db`], or on drop if a tool failed or panicked first.
#![allow(dead_code)]

use anyhow::{Context, Result};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[path = "../../../../tests/common/databases.rs"]
mod databases;
use databases::{create_database, drop_database, drop_database_from_drop, with_database};

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
        create_database(server, &name)
            .await
            .context("create a database on DATABASE_URL (a role that may CREATE DATABASE)")?;
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
        Ok(drop_database(&self.server, &self.name).await?)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Reached when a tool failed or panicked.
        drop_database_from_drop(self.server.clone(), self.name.clone());
    }
}
