-- Least-privilege accounts for chat-delivery. Run as an administrator, AFTER
-- the migrations have created the tables (table-level grants need the tables),
-- with the three passwords passed as session variables so they never live in a
-- file or in shell history:
--
--   read -rs API_PW; read -rs MIGRATE_PW; read -rs DAEMON_PW
--   mariadb -u root -p \
--     --init-command="SET @api_pw='$API_PW', @migrate_pw='$MIGRATE_PW', @daemon_pw='$DAEMON_PW'" \
--     < deploy/mysql/grants.sql
--
-- (A password containing a single quote must be escaped for that SET.)
-- Safe to run again: it (re)sets the passwords and re-applies the grants.
-- Unset variables make the PREPARE below fail (CONCAT with NULL is NULL),
-- so the script cannot create an account with an empty password.

-- ---- chat_migrate: runs `python -m db.init` / `alembic upgrade head` ----------
-- Schema changes (CREATE, ALTER, DROP, INDEX, REFERENCES), plus the row
-- privileges Alembic needs for alembic_version and for data migrations such as
-- 0001's INSERT into stream_state. CREATE on chat.* also covers db.init's
-- `CREATE DATABASE IF NOT EXISTS chat`. Not used by any running service.
SET @sql = CONCAT('CREATE USER IF NOT EXISTS ''chat_migrate''@''%'' IDENTIFIED BY ', QUOTE(@migrate_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
SET @sql = CONCAT('ALTER USER ''chat_migrate''@''%'' IDENTIFIED BY ', QUOTE(@migrate_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
GRANT ALTER, CREATE, DROP, INDEX, REFERENCES, SELECT, INSERT, UPDATE, DELETE
  ON chat.* TO 'chat_migrate'@'%';

-- ---- chat_api: the API processes ---------------------------------------------------
-- What writer/mysql_steps.py, writer/message_writer.py, writer/echo_sql.py and api/app.py execute:
--   messages      SELECT (history, retries by client_msg_id, outbox repair), INSERT
--   stream_state  SELECT (last_id, mirrored_upto), UPDATE (advance them)
--   partition_map SELECT (the slot map, read at start)
--   echoes        SELECT, INSERT (a copy owed), DELETE (the copy made): rows of
--                 debts between partitions, never messages
-- and the same as on messages and stream_state on each partition's
-- messages_p{k} and stream_state_p{k} (the loop at the end of this file).
-- plus UPDATE on messages and INSERT on stream_state, which today's code does
-- not use (the migration inserts the stream_state row); they keep the grant
-- uniform per table. Drop them for the tightest set. No DELETE on either:
-- messages are permanent, and a compromised API host cannot erase history.
-- The writer's lock is GET_LOCK('chat.writer', t) / RELEASE_LOCK: user-level
-- locks need no privilege at all (they are not table locks). The per-session
-- `SET SESSION max_statement_time` needs none either.
-- The daemons have an account of their own (chat_daemon, below).
SET @sql = CONCAT('CREATE USER IF NOT EXISTS ''chat_api''@''%'' IDENTIFIED BY ', QUOTE(@api_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
SET @sql = CONCAT('ALTER USER ''chat_api''@''%'' IDENTIFIED BY ', QUOTE(@api_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
GRANT SELECT, INSERT, UPDATE ON chat.messages     TO 'chat_api'@'%';
GRANT SELECT, INSERT, UPDATE ON chat.stream_state TO 'chat_api'@'%';
GRANT SELECT ON chat.partition_map TO 'chat_api'@'%';
GRANT SELECT, INSERT, DELETE ON chat.echoes TO 'chat_api'@'%';

-- '%' because API hosts come and go; restrict it to your app subnet
-- (e.g. 'chat_api'@'10.0.1.%') where the network layout is stable, and keep
-- port 3306 closed to everything else.

-- ---- chat_daemon: the delivery daemons ----------------------------------------------
-- What db/stream_ranges.py executes: a SELECT of a range of ids in messages,
-- when a daemon's oplog tail skipped some (a fall-off). Read-only: a
-- compromised daemon host can neither write nor erase a message.
SET @sql = CONCAT('CREATE USER IF NOT EXISTS ''chat_daemon''@''%'' IDENTIFIED BY ', QUOTE(@daemon_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
SET @sql = CONCAT('ALTER USER ''chat_daemon''@''%'' IDENTIFIED BY ', QUOTE(@daemon_pw));
PREPARE stmt FROM @sql; EXECUTE stmt; DEALLOCATE PREPARE stmt;
GRANT SELECT ON chat.messages TO 'chat_daemon'@'%';
GRANT SELECT ON chat.partition_map TO 'chat_daemon'@'%';  -- the slot map, read at start

-- ---- the tables of partitions k > 0 ---------------------------------------------------
-- Their number is data (db.init, `chatctl partitions grow`), so their grants are
-- given here for every such table that exists: run this file again after a grow.
-- The same as partition 0's: chat_api reads and writes messages_p{k} and
-- stream_state_p{k}; chat_daemon reads messages_p{k}.
DELIMITER //
BEGIN NOT ATOMIC
  FOR t IN (SELECT table_name AS name FROM information_schema.tables
            WHERE table_schema = 'chat' AND table_name REGEXP '^(messages|stream_state)_p[0-9]+$') DO
    EXECUTE IMMEDIATE CONCAT('GRANT SELECT, INSERT, UPDATE ON chat.', t.name, ' TO ''chat_api''@''%''');
    IF t.name LIKE 'messages%' THEN
      EXECUTE IMMEDIATE CONCAT('GRANT SELECT ON chat.', t.name, ' TO ''chat_daemon''@''%''');
    END IF;
  END FOR;
END //
DELIMITER ;
