//! A scratch database for the load tools and benches: created on the server of `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`), migrated, dropped `WITH (FORCE)`.
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
}

impl Scratch {
    /// Creates `ordo_load_<random>` and runs ordo's migrations in it.
    pub async fn create(server: &str) -> Result<Self> {
        let name = format!("ordo_load_{}", uuid::Uuid::new_v4().simple());
        let admin = PgPool::connect(server)
            .await
            .context("connect to DATABASE_URL")?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await?;
        admin.close().await;
        let (base, _) = server
            .rsplit_once('/')
            .context("a URL with a database name")?;
        let url = format!("{base}/{name}");
        let pool = PgPool::connect(&url).await?;
        ordo::migrate(&pool).await?;
        pool.close().await;
        Ok(Self {
            server: server.to_owned(),
            url,
            name,
        })
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

    pub async fn drop_db(self) -> Result<()> {
        let admin = PgPool::connect(&self.server).await?;
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
        Ok(())
    }
}
