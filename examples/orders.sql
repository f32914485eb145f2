-- Revenue per user from an upsert log of orders (write one with examples/orders_log.py).
-- keyflow sql examples/orders.sql --checkpoint ckpt/orders --available-now

SET 'pipeline.name' = 'orders-revenue';
SET 'parallelism.default' = '2';

-- Each row replaces the order of its order_id; a row whose other columns are all null deletes it.
-- Read by 3 tasks, routed by order_id's key group to the 2 tasks that keep each order's last row.
CREATE TABLE orders (
    order_id BIGINT,
    user_id  STRING,
    amount   DOUBLE,
    PRIMARY KEY (order_id) NOT ENFORCED
) WITH (
    'connector' = 'upsert-log',
    'path' = 'data/orders',
    'scan.parallelism' = '3'
);

-- The result is a changelog: each change of a user's revenue retracts the old row (-U) and adds the new (+U).
CREATE TABLE revenue (
    user_id STRING,
    orders  BIGINT,
    revenue DOUBLE,
    largest DOUBLE,
    PRIMARY KEY (user_id) NOT ENFORCED
) WITH (
    'connector' = 'filesystem',
    'path' = 'out/revenue',
    'format' = 'parquet'
);

INSERT INTO revenue
SELECT user_id, COUNT(*), SUM(amount), MAX(amount)
FROM orders
GROUP BY user_id;
